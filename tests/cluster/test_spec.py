"""The cluster spec: defaults, YAML, flags laid over it, and an error naming the field for every mistake."""

from __future__ import annotations

import pytest

from cluster.cli import main, parse_args, spec_from_args
from cluster.spec import ClusterSpec, SpecError, load_spec, parse_spec, with_overrides
from cluster.workers import COLOCATED_THRESHOLD, decode_config, engine_args_for, placement_options

HETEROGENEOUS = """
model: /models/tiny
engine: {max_model_len: 256, num_kv_blocks: 48, block_size: 32}
router: {port: 0, routing_policy: round_robin}
prefill: {replicas: 2, resources: {gpu_a: 1}, node_labels: {tier: fast}}
decode: {replicas: 1, tensor_parallel_size: 2, dtype: float32, resources: {gpu_b: 1}}
"""


def test_defaults_are_one_prefill_one_decode_on_the_default_model():
    spec = parse_spec(None)
    assert spec.model is None and (spec.prefill.replicas, spec.decode.replicas) == (1, 1)
    assert (spec.router.host, spec.router.port, spec.router.routing_policy) == ("127.0.0.1", 8000, "cache_aware")


def test_a_yaml_spec_reaches_engine_args_and_ray_options(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(HETEROGENEOUS)
    spec = load_spec(path)
    decode = engine_args_for(spec, "decode")
    assert (decode.model, decode.tensor_parallel_size, decode.dtype) == ("/models/tiny", 2, "float32")
    assert decode.num_kv_blocks == 48
    assert (decode.block_size, decode.max_model_len) == (32, 256)
    assert engine_args_for(spec, "prefill").tensor_parallel_size == 1
    prefill = placement_options(spec.prefill)
    assert prefill == {"num_gpus": 0, "resources": {"gpu_a": 1}, "label_selector": {"tier": "fast"}}
    assert placement_options(spec.decode) == {"num_gpus": 0, "resources": {"gpu_b": 1}}


@pytest.mark.parametrize(
    "data, field",
    [
        ({"decode": {"replicas": 0}}, "decode.replicas must be >= 1"),
        ({"prefill": {"replicas": -1}}, "prefill.replicas"),
        ({"prefill": {"tensor_parallel_size": 0}}, "prefill.tensor_parallel_size"),
        ({"decode": {"dtype": "float8"}}, "decode.dtype"),
        ({"decode": {"resources": {"gpu_b": 0}}}, "decode.resources"),
        ({"prefill": {"resources": {"GPU": 1}}}, "use num_gpus"),
        ({"prefill": {"replica": 2}}, "prefill.replica: unknown field"),
        ({"engine": {"block_size": 0}}, "engine.block_size"),
        ({"engine": {"num_kv_blocks": 8, "kv_cache_memory": 2**20}}, "engine: set kv_cache_memory or num_kv_blocks"),
        ({"router": {"routing_policy": "random"}}, "router.routing_policy: unknown routing policy 'random'"),
        ({"router": {"port": 70000}}, "router.port"),
        ({"router": {"tool_call_parser": "mistral"}}, "router.tool_call_parser: unknown tool call parser 'mistral'"),
        ({"health": {"interval_s": 0}}, "health.interval_s"),
        ({"workers": 3}, "workers: unknown field"),
    ],
)
def test_every_mistake_names_its_field(data, field):
    with pytest.raises(SpecError, match=field.replace("(", r"\(")):
        parse_spec(data)


def test_files_that_are_not_specs_say_so(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("prefill: [1, 2\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="a mapping"):
        load_spec(bad)
    bad.write_text("decode: {replicas: two}\n")
    with pytest.raises(SpecError, match=r"bad.yaml: decode.replicas"):
        load_spec(bad)


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(HETEROGENEOUS)
    args = ["serve", "--config", str(path), "--num-decode", "3", "-tp", "1", "--port", "9000",
            "--no-enable-prefix-caching"]  # fmt: skip
    spec = spec_from_args(parse_args(args))
    assert (spec.prefill.replicas, spec.decode.replicas, spec.decode.tensor_parallel_size) == (2, 3, 1)
    assert (spec.router.port, spec.engine.enable_prefix_caching, spec.prefill.resources) == (9000, False, {"gpu_a": 1})
    assert with_overrides(ClusterSpec(), {"prefill.replicas": 0}).prefill.replicas == 0


def test_quantization_is_auto_unless_a_flag_or_the_file_says_none_and_reaches_every_pools_engine():
    assert engine_args_for(spec_from_args(parse_args(["serve"])), "decode").quantization == "auto"
    spec = spec_from_args(parse_args(["serve", "--quantization", "none"]))
    assert engine_args_for(spec, "decode").quantization == engine_args_for(spec, "prefill").quantization == "none"
    with pytest.raises(SpecError, match="engine.quantization"):
        parse_spec({"engine": {"quantization": "int4"}})


def test_no_prefill_pool_is_colocated_mode_and_torch_threads_reach_both_pools():
    spec = spec_from_args(parse_args(["serve", "--num-prefill", "0", "--num-decode", "2", "--torch-threads", "2"]))
    assert (spec.prefill.torch_threads, spec.decode.torch_threads) == (2, 2)
    assert decode_config(spec, "d0").local_prefill_threshold == COLOCATED_THRESHOLD  # decode prefills every prompt
    assert decode_config(ClusterSpec(), "d0").local_prefill_threshold == 0  # a prefill pool prefills them all


def test_cpu_pinning_is_on_unless_turned_off():
    assert spec_from_args(parse_args(["serve"])).cpu_pinning
    assert not spec_from_args(parse_args(["serve", "--no-cpu-pinning"])).cpu_pinning


def test_the_cli_reports_a_bad_flag_without_a_traceback(capsys):
    with pytest.raises(SystemExit, match="decode.replicas must be >= 1"):
        main(["serve", "--num-decode", "0"])


def test_the_example_spec_in_scripts_is_valid():
    import pathlib

    spec = load_spec(pathlib.Path(__file__).parents[2] / "scripts" / "cluster_spec.yaml")
    assert spec.prefill.resources == {"gpu_H100": 1} and spec.decode.node_labels == {"gpu": "L40S"}


def test_joining_a_ray_cluster_binds_the_data_plane_on_node_addresses_unless_the_spec_says(tmp_path):
    assert spec_from_args(parse_args(["serve", "--num-decode", "2"])).data_plane == "loopback"
    assert spec_from_args(parse_args(["serve", "--address", "10.0.0.1:6379"])).data_plane == "node_ip"
    path = tmp_path / "spec.yaml"
    path.write_text("data_plane: loopback\n")
    assert spec_from_args(parse_args(["serve", "--config", str(path), "--address", "auto"])).data_plane == "loopback"


def test_the_kv_transfer_failure_flag_sets_the_policy():
    assert spec_from_args(parse_args(["serve"])).kv_transfer_failure == "recompute"
    spec = spec_from_args(parse_args(["serve", "--kv-transfer-failure", "fail"]))
    assert spec.kv_transfer_failure == "fail"
    with pytest.raises(SystemExit):
        parse_args(["serve", "--kv-transfer-failure", "retry"])


def test_the_routers_load_polls_give_up_on_a_worker_after_the_specs_heartbeat_timeout(tiny_model_dirs):
    from cluster.deployment import router_config

    spec = parse_spec({"model": tiny_model_dirs["llama"], "health": {"timeout_s": 42}})
    assert router_config(spec).worker_call_timeout_s == 42  # not the router's own 10 s default


def test_the_tool_call_parser_flag_reaches_the_router(tiny_model_dirs):
    from cluster.deployment import router_config

    spec = spec_from_args(parse_args(["serve", "--model", tiny_model_dirs["llama"], "--tool-call-parser", "hermes"]))
    assert router_config(spec).tool_call_parser == "hermes"
    assert router_config(parse_spec({"model": tiny_model_dirs["llama"]})).tool_call_parser is None


def test_the_api_key_comes_from_a_file_or_the_environment_never_only_the_command_line(tmp_path, monkeypatch):
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    assert spec_from_args(parse_args(["serve", "--api-key-file", str(key_file)])).router.api_key == "sk-from-file"
    monkeypatch.setenv("TANDEM_API_KEY", "sk-from-env")
    assert spec_from_args(parse_args(["serve"])).router.api_key == "sk-from-env"
    assert spec_from_args(parse_args(["serve", "--api-key-file", str(key_file)])).router.api_key == "sk-from-file"
    (tmp_path / "empty").write_text("")
    for bad in (["--api-key-file", str(tmp_path / "empty")], ["--api-key-file", str(tmp_path / "missing")],
                ["--api-key", "a", "--api-key-file", str(key_file)]):  # fmt: skip
        with pytest.raises(SystemExit):
            parse_args(["serve", *bad])
