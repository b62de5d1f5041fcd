"""The `tandem` command line.

    tandem serve [--model M] [--port 8000] [--num-prefill 1 --num-decode 1] [--config spec.yaml] [--address ADDR]
                 [--api-key KEY]
    tandem scale --prefill N --decode M [--url http://127.0.0.1:8000] [--admin-token TOKEN]
    tandem status [--url http://127.0.0.1:8000] [--json] [--admin-token TOKEN]

`--api-key` defaults to the environment variable TANDEM_API_KEY (as vLLM's
`--api-key` does to VLLM_API_KEY): `serve` then requires it on /v1/*. /admin/*
takes only the admin token `serve` makes at each start and writes 0600 for its
user (`cluster.admin_token`); `scale` / `status` read it from there.

`serve` without `--address` starts an embedded local Ray; flags override the
spec file's fields (vLLM's names). Ctrl-C (SIGINT) or SIGTERM stops the
workers, the router and the embedded Ray. When the cluster is gone for good
(the Ray cluster killed, or the controller dead beyond its restarts) `serve`
says why, stops what is left and exits with status 1 (`cluster.lifeline`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from cluster.spec import QUANTIZATION_HELP, QUANTIZATIONS, ClusterSpec, SpecError, load_spec, with_overrides
from router.tool_parsers import PARSERS

# flag dest -> spec field; a flag left unset keeps the spec's value
_FLAG_FIELDS = {
    "model": "model",
    "max_model_len": "engine.max_model_len",
    "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "block_size": "engine.block_size",
    "enable_prefix_caching": "engine.enable_prefix_caching",
    "kv_cache_memory": "engine.kv_cache_memory",
    "num_kv_blocks": "engine.num_kv_blocks",
    "quantization": "engine.quantization",
    "host": "router.host",
    "port": "router.port",
    "routing_policy": "router.routing_policy",
    "served_model_name": "router.served_model_name",
    "api_key": "router.api_key",
    "max_request_body_bytes": "router.max_request_body_bytes",
    "max_predicted_ttft_s": "router.max_predicted_ttft_s",
    "tool_call_parser": "router.tool_call_parser",
    "shutdown_grace_s": "router.shutdown_grace_s",
    "num_prefill": "prefill.replicas",
    "num_decode": "decode.replicas",
    "kv_transfer_failure": "kv_transfer_failure",
    "cpu_pinning": "cpu_pinning",
    "grammar_compile_timeout_s": "grammars.compile_timeout_s",
    "max_grammar_compiles_waiting": "grammars.max_compiles_waiting",
}
_BOTH_POOLS = {"dtype": "dtype", "tensor_parallel_size": "tensor_parallel_size", "torch_threads": "torch_threads"}


def _serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model: Ray workers (prefill + decode) behind an OpenAI-compatible router")
    add_spec_flags(p)
    p.add_argument("--address", help="join this Ray cluster (ray start --head ...); default: an embedded local Ray")
    p.add_argument("--served-model-name")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="default 8000")
    p.add_argument("--cpu-pinning", action=argparse.BooleanOptionalAction, default=None,
                   help="one machine without GPUs: each worker rank on cores of its own (default: on)")
    p.add_argument("--kv-transfer-failure", choices=("recompute", "fail"),
                   help="a failed KV transfer: decode prefills the prompt itself (default) or the request fails")
    _api_key_flag(p, "required on /v1/* as `Authorization: Bearer KEY` (/admin/* takes the admin token)")
    p.add_argument("--max-request-body-bytes", type=int, help="larger HTTP bodies get 413 (default 8 MiB)")
    p.add_argument("--shutdown-grace-s", type=float,
                   help="on SIGTERM or Ctrl-C, new requests get 503 and /health fails while what is in flight "
                        "finishes, for at most this long; then everything stops (default 30; a second signal: now)")
    p.add_argument("--tool-call-parser", choices=sorted(PARSERS),
                   help="how tool_choice auto reads tool calls in the model's output (default: auto is refused)")
    p.add_argument("--grammar-compile-timeout-s", type=float,
                   help="a structured-output grammar that takes longer to compile is refused with 400 (default 30)")
    p.add_argument("--max-grammar-compiles-waiting", type=int,
                   help="grammars compiling or queued per worker; past it a new grammar gets 503 (default 16)")


def add_spec_flags(p) -> None:
    """The flags that say what runs where: `serve` takes them, and `simulate` / `plan` take the same."""
    p.add_argument("--config", help="cluster spec YAML (pools, resources, engine, router); flags override it")
    p.add_argument("--model", help="HF directory, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="both pools")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--kv-cache-memory", type=int, help="KV cache bytes per worker")
    p.add_argument("--num-kv-blocks", type=int, help="KV cache blocks per worker (instead of --kv-cache-memory)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, help=QUANTIZATION_HELP)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, help="both pools")
    p.add_argument("--torch-threads", type=int, help="torch threads per worker rank, both pools (default 1)")
    p.add_argument("--routing-policy", help="cache_aware (default), least_loaded, round_robin")
    p.add_argument("--num-prefill", type=int, help="prefill workers (0: decode workers prefill themselves)")
    p.add_argument("--num-decode", type=int, help="decode workers")
    p.add_argument("--max-predicted-ttft-s", type=float,
                   help="refuse (429, Retry-After) a request whose first token is predicted later (default 60; 0: off)")


def _api_key_flag(parser, what: str) -> None:
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY") or None,
                      help=f"{what} (default: $TANDEM_API_KEY; on the command line it shows in `ps`)")  # fmt: skip
    keys.add_argument("--api-key-file", type=_key_from_file, dest="api_key",
                      help="the API key, read from the first line of this file (nothing of it in `ps`)")  # fmt: skip


def _key_from_file(path: str) -> str:
    try:
        key = Path(path).read_text().splitlines()[0].strip() if Path(path).stat().st_size else ""
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot read the API key file: {err}") from None
    if not key:
        raise argparse.ArgumentTypeError(f"the API key file {path} is empty")
    return key


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    """The spec file (or the defaults) with every flag that was given laid over it."""
    spec = load_spec(args.config) if args.config else ClusterSpec()
    given = {dest: getattr(args, dest, None) for dest in (*_FLAG_FIELDS, *_BOTH_POOLS)}  # a command may lack some
    overrides = {field: given[dest] for dest, field in _FLAG_FIELDS.items() if given[dest] is not None}
    for dest, field in _BOTH_POOLS.items():
        if given[dest] is not None:
            overrides[f"prefill.{field}"] = overrides[f"decode.{field}"] = given[dest]
    if getattr(args, "address", None) and "data_plane" not in spec.model_fields_set:
        overrides["data_plane"] = "node_ip"  # workers may be on other machines: bind where they can reach
    return with_overrides(spec, overrides)


def serve(args: argparse.Namespace) -> None:
    spec = spec_from_args(args)  # a bad flag or file fails here, before anything starts

    import ray

    from cluster.deployment import Deployment, connect_ray
    from cluster.lifeline import Lifeline, exit_now
    from cluster.ray_leftovers import EmbeddedRayProcesses

    _stop_on_signals()
    where = connect_ray(args.address)
    _stop_on_signals()  # again: ray.init may install its own
    embedded_ray = None if args.address else EmbeddedRayProcesses()
    if embedded_ray is not None:
        embedded_ray.note()  # Ray's core and its agents, started by now (the lifeline adds later ones)
    lifeline = Lifeline(ray.get_runtime_context().gcs_address, give_up=functools.partial(exit_now, embedded_ray=embedded_ray),
                        on_check=embedded_ray.note if embedded_ray else lambda: None).start()  # fmt: skip
    deployment = None
    try:
        from cluster.layout import Machines, choose_layout

        machines = Machines.of_ray_cluster()
        spec, why = choose_layout(spec, machines)
        print(f"tandem: {where}; layout: {why}", flush=True)
        _keep_off_worker_cores(spec, machines)
        deployment = Deployment(spec)
        deployment.start()
        lifeline.watch_controller(deployment.controller)
        from runtime.serving_gc import tune_gc_for_serving

        tune_gc_for_serving()  # this process now only serves: the router, the admin endpoints, the sync
        from cluster.status import render_status

        print(render_status(deployment.controller.status()), flush=True)
        print(f"tandem: serving {deployment.config.model_name} at {deployment.url}/v1 (Ctrl-C to stop)", flush=True)
        lifeline.wait()
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, or the lifeline interrupting a start-up gone for good
        print(_ending(lifeline), flush=True)
        if deployment is not None and lifeline.gone is None:
            _drain(deployment, spec.router.shutdown_grace_s)
    except Exception:
        if not lifeline.confirm_gone():
            raise  # failed on its own account: main says why (what started is stopped below)
        print(_ending(lifeline), flush=True)  # a call that failed because the cluster went: say that
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        lifeline.stop()
        gone = lifeline.gone
        ray_alive = gone is None or gone.ray_alive
        if deployment is not None:
            deployment.stop(ray_alive=ray_alive)
        if embedded_ray is not None and not ray_alive:
            embedded_ray.end()  # what its dead core left; ray.shutdown() would wait on the dead raylet first
        else:
            ray.shutdown()
    print("tandem: stopped", flush=True)
    if embedded_ray is not None and not ray_alive:
        # Ray's core worker in this process outlives its raylet: the interpreter's exit would crash in it
        # (SIGSEGV, measured). End the process as the lifeline's last resort does, with main's message.
        print(f"tandem: error: {gone}", file=sys.stderr, flush=True)
        os._exit(1)
    if gone is not None:
        raise gone  # main: the message, status 1


def _drain(deployment, grace_s: float) -> None:
    """Let what is in flight finish (new requests: 503) for at most `grace_s`; a second signal ends it now."""
    print(f"tandem: draining: new requests get 503; waiting up to {grace_s:g} s for those in flight "
          "(Ctrl-C again to stop now)", flush=True)  # fmt: skip
    try:
        left = deployment.drain(grace_s)
    except KeyboardInterrupt:
        left = deployment.in_flight()
    if left:
        print(f"tandem: {left} sequence(s) still in flight: they end with an error", flush=True)


def _keep_off_worker_cores(spec, machines) -> None:
    """One machine without GPUs, pinned workers (`cluster.core_map`): this process (the router) goes on the
    cores the workers leave over, else on the prefill ranks'. Ray's daemons, started before, stay unpinned."""
    import os

    from cluster.core_map import core_map_for
    from runtime.cpu_pinning import pin_this_process

    cores = core_map_for(spec, machines, tuple(os.sched_getaffinity(0)))
    if cores is None:
        return
    pinned = pin_this_process(cores.serve)
    print(f"tandem: router on cores {','.join(map(str, pinned))}", flush=True)


def _ending(lifeline) -> str:
    return f"tandem: {lifeline.gone}; shutting down" if lifeline.gone else "tandem: shutting down"


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM end `serve` like Ctrl-C, through its cleanup (SIGINT also when a
    non-interactive shell started us in the background with SIGINT ignored)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class AdminError(RuntimeError):
    """`tandem scale` / `status` could not get an answer from the router."""


def _admin(url: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
    """Call an admin endpoint with `token`, or the one `tandem serve` wrote for that URL's address."""
    from cluster.admin_token import read_token, token_path

    token = token or read_token(url)
    if token is None:
        raise AdminError(f"no admin token for {url}: `tandem serve` writes one to "
                         f"{token_path('host', 0).parent}/<host>-<port>.token on its machine; pass it with "
                         "--admin-token")  # fmt: skip
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"{url.rstrip('/')}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=3600) as response:
            return json.load(response)
    except urllib.error.HTTPError as err:
        raise AdminError(f"{path}: HTTP {err.code}: {err.read().decode(errors='replace')}") from None
    except urllib.error.URLError as err:
        raise AdminError(f"cannot reach tandem at {url}: {err.reason}") from None


def _print_status(status: dict, as_json: bool) -> None:
    from cluster.status import render_status

    print(json.dumps(status, indent=2) if as_json else render_status(status))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tandem", description="Disaggregated prefill/decode LLM serving on Ray")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    from cluster import plan_cli

    plan_cli.add_parsers(sub)
    for name, what in (("scale", "resize the pools of a running `tandem serve`"), ("status", "pools, workers, nodes")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--url", default="http://127.0.0.1:8000", help="the router of `tandem serve`")
        p.add_argument("--json", action="store_true", help="print the raw status")
        p.add_argument("--admin-token", default=os.environ.get("TANDEM_ADMIN_TOKEN"),
                       help="the admin token (default: $TANDEM_ADMIN_TOKEN, else the file `tandem serve` wrote)")
        if name == "scale":
            p.add_argument("--prefill", type=int, help="prefill workers")
            p.add_argument("--decode", type=int, help="decode workers")
    args = parser.parse_args(argv)
    if args.command == "scale" and args.prefill is None and args.decode is None:
        parser.error("scale: give --prefill and/or --decode")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.command == "serve":
            serve(args)
        elif args.command in ("profile", "simulate"):
            from cluster import plan_cli

            getattr(plan_cli, f"run_{args.command}")(args)
        elif args.command == "plan":
            from cluster.plan_command import run_plan

            run_plan(args)
        elif args.command == "scale":
            scale = {"prefill": args.prefill, "decode": args.decode}
            _print_status(_admin(args.url, "/admin/scale", scale, args.admin_token), args.json)
        else:
            _print_status(_admin(args.url, "/admin/status", token=args.admin_token), args.json)
    except (SpecError, ValueError, FileNotFoundError, RuntimeError, TimeoutError) as err:
        # A user-facing tool: the message says what is wrong, no traceback.
        sys.exit(f"tandem: error: {err}")


if __name__ == "__main__":
    main()
