"""KV transfer bandwidth: ZMQ-IPC, ZMQ-TCP loopback and gloo, next to a raw loopback TCP socket.

One request's KV (all layers, K and V) moves from a sender in this process to a
receiver in a spawned process, through the public `kvtransfer` API: handshake
once, then per rep `send` + `send_layer` for every layer, timed until the
sender sees the receiver's `done`. Block ids come in runs of `run length`
consecutive blocks: a run of at least 256 KiB is one zero-copy frame (whole runs
about 1 MiB per message, `KVSender.message_bytes`), shorter runs are gathered
into one frame per layer (`KVSender.gather_below_bytes`).
The baseline, measured in the same run, pushes the same bytes in frames of
the run's size through a plain TCP socket on 127.0.0.1
from a buffer of the whole transfer into another (as the KV moves between two
caches), acknowledged once at the end.

    python scripts/bench_kvtransfer.py                          # print the table
    python scripts/bench_kvtransfer.py --markdown BENCHMARKS.md # and record it (BENCHMARKS.md, benchmarks/history/)
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bench_report
import torch

from kvtransfer import KVReceiver, KVSender, KVSpec, PeerTarget

TRANSPORTS = ("zmq-ipc", "zmq-tcp", "gloo")
CTX = multiprocessing.get_context("spawn")
# Poll timeouts of the harness's own loops. Both return as soon as a message arrives; 1 ms
# timeouts had the waiting sender and every idle receiver wake 1000 times a second, which
# on a 2-core machine took CPU from the transfer being timed (the raw side blocks in recv).
WAIT_POLL_MS = 100
COMMAND_POLL_MS = 20


def spec_for(args, block_size: int) -> KVSpec:
    return KVSpec("bench", args.dtype, block_size, args.layers, args.kv_heads, args.head_dim)


def block_bytes(spec: KVSpec) -> int:
    return spec.block_size * spec.num_kv_heads * spec.head_dim * getattr(torch, spec.dtype).itemsize


def run_ordered_ids(num_blocks: int, run_length: int) -> list[int]:
    """0..n-1 cut into runs of `run_length`, runs in reverse order: consecutive only within a run."""
    runs = [list(range(s, min(s + run_length, num_blocks))) for s in range(0, num_blocks, run_length)]
    return [b for run in reversed(runs) for b in run]


def caches(spec: KVSpec, num_blocks: int, fill: bool):
    shape = (num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
    make = torch.randn if fill else torch.zeros
    return [(make(shape).to(getattr(torch, spec.dtype)), make(shape).to(getattr(torch, spec.dtype)))
            for _ in range(spec.num_layers)]  # fmt: skip


# -- the receiving process --


def receiver_proc(conn, transport: str, ipc_dir: str) -> None:
    """Serve cases on command: ("case", spec, num_blocks) -> address; ("recv", id, block ids) -> "ok"."""
    torch.set_num_threads(1)
    receiver = None
    while True:
        if receiver is not None:
            # Wakes when a message arrives; the timeout only bounds how late a command is read
            # (commands come before the timed part). Short timeouts would steal CPU from the run.
            receiver.poll(COMMAND_POLL_MS)
        if not conn.poll(0 if receiver is not None else None):
            continue
        cmd = conn.recv()
        if cmd[0] == "case":
            if receiver is not None:
                receiver.close()
            spec, num_blocks, n = cmd[1], cmd[2], cmd[3]
            address = f"ipc://{ipc_dir}/kv-{n}.sock" if transport == "zmq-ipc" else "tcp://127.0.0.1:0"
            receiver = KVReceiver(caches(spec, num_blocks, fill=False), spec, address, dist_backend="gloo")
            conn.send(receiver.address)
        elif cmd[0] == "recv":
            receiver.recv(cmd[1], cmd[2])
            conn.send("ok")
        else:
            if receiver is not None:
                receiver.close()
            return


def raw_receiver_proc(conn) -> None:
    """Plain TCP: per rep read (total, frame size), recv_into a buffer of the whole transfer, ack one byte."""
    server = socket.create_server(("127.0.0.1", 0))
    conn.send(server.getsockname()[1])
    peer, _ = server.accept()
    dest = memoryview(b"")
    while True:
        header = peer.recv(16, socket.MSG_WAITALL)
        if len(header) < 16:
            return
        total, frame = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:], "little")
        if dest.nbytes != total:  # like the cache: distinct memory, allocated once, paged in by the warm-up
            dest = memoryview(bytearray(total))
        got = 0
        while got < total:
            got += peer.recv_into(dest[got : min(got + frame, total)])
        peer.sendall(b"k")


# -- timing --


class KVCase:
    """One transport set up for one case: a receiver (child process) and a connected sender."""

    def __init__(self, transport: str, proc, conn, spec: KVSpec, num_blocks: int, run_length: int, case_no: int):
        self.transport, self.pid, self.conn, self.spec = transport, proc.pid, conn, spec
        conn.send(("case", spec, num_blocks, case_no))
        self.address = conn.recv()
        self.sender = KVSender(spec, "bench", data_plane="gloo" if transport == "gloo" else "zmq")
        self.src = caches(spec, num_blocks, fill=True)
        self.ids = run_ordered_ids(num_blocks, run_length)
        self.reps = 0

    def time_one(self) -> float:
        """Seconds for one request's KV, from the first send to the sender seeing done."""
        self.reps += 1
        request_id = f"{self.address}-{self.reps}"
        self.conn.send(("recv", request_id, self.ids))
        self.conn.recv()
        start = time.perf_counter()
        self.sender.send(request_id, self.ids, PeerTarget(self.address, tuple(self.ids)))
        for layer in range(self.spec.num_layers):
            self.sender.send_layer(request_id, layer, *self.src[layer])
        events = []
        while not events:  # returns as soon as the receiver's answer arrives, like the raw side's recv
            events = self.sender.poll(WAIT_POLL_MS)
        if events[0].kind != "done":
            raise RuntimeError(f"{self.transport}: transfer ended {events[0]}")
        return time.perf_counter() - start


class RawCase:
    def __init__(self, proc, sock: socket.socket, total: int, frame: int):
        self.pid, self.sock, self.total, self.frame = proc.pid, sock, total, frame
        self.source = memoryview(bytearray(os.urandom(total)))  # like the cache: distinct memory for every frame

    def time_one(self) -> float:
        start = time.perf_counter()
        self.sock.sendall(self.total.to_bytes(8, "little") + self.frame.to_bytes(8, "little"))
        for sent in range(0, self.total, self.frame):
            self.sock.sendall(self.source[sent : min(sent + self.frame, self.total)])
        self.sock.recv(1)
        return time.perf_counter() - start


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (ZMQ's and gloo's I/O threads too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(cases: dict, total: int, reps: int) -> dict[str, float]:
    """Median GB/s per transport, and CPU seconds per GB (sender + receiver process) over all reps.

    Reps are interleaved across transports, so load from elsewhere on the machine hits all alike."""
    times = {name: [] for name in cases}
    cpu = dict.fromkeys(cases, 0.0)
    for rep in range(reps + 1):  # the first is warm-up (handshake, page faults)
        for name, case in cases.items():
            before = time.process_time() + process_cpu_s(case.pid)
            t = case.time_one()
            if rep:
                times[name].append(t)
                cpu[name] += time.process_time() + process_cpu_s(case.pid) - before
    out = {name: total / statistics.median(ts) / 1e9 for name, ts in times.items()}
    out.update({f"{name} cpu": cpu[name] / (reps * total / 1e9) for name in cases})
    return out


def start(target, *args):
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=target, args=(child, *args), daemon=True)
    proc.start()
    return proc, parent


def run(args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="tandem-kv-bench-") as ipc_dir:
        return run_in(args, ipc_dir)


def run_in(args, ipc_dir: str) -> list[dict]:
    procs = {t: start(receiver_proc, t, ipc_dir) for t in TRANSPORTS}  # transport -> (process, pipe)
    raw_proc, raw_conn = start(raw_receiver_proc)
    raw_sock = socket.create_connection(("127.0.0.1", raw_conn.recv()))
    rows, case_no = [], 0
    for block_size in args.block_sizes:
        spec = spec_for(args, block_size)
        num_blocks = max(1, args.transfer_mib * 2**20 // (2 * spec.num_layers * block_bytes(spec)))
        total = 2 * spec.num_layers * num_blocks * block_bytes(spec)
        for run_length in args.run_lengths:
            case_no += 1
            frame = min(run_length, num_blocks) * block_bytes(spec)
            row = {"block_size": block_size, "run_length": run_length, "frame": frame, "total": total}
            cases = {"raw-tcp": RawCase(raw_proc, raw_sock, total, frame)}
            for transport, (proc, conn) in procs.items():
                cases[transport] = KVCase(transport, proc, conn, spec, num_blocks, run_length, case_no)
            row.update(measure(cases, total, args.reps))
            for name, case in cases.items():
                if name != "raw-tcp":
                    case.sender.close()
            rows.append(row)
            print(table_row(row), flush=True)
    for proc, conn in procs.values():
        conn.send(("stop",))
        proc.join(10)
    raw_sock.close()
    raw_proc.join(10)
    return rows


# -- report --

HEADER = (
    "| block tokens | run (blocks) | run KiB | transfer MiB | raw TCP GB/s | ZMQ-IPC GB/s | ZMQ-TCP GB/s "
    "| gloo GB/s | ZMQ-TCP / raw | CPU s/GB raw | CPU s/GB ZMQ-TCP |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_row(r: dict) -> str:
    return (
        f"| {r['block_size']} | {r['run_length']} | {r['frame'] / 1024:.0f} | {r['total'] / 2**20:.0f} "
        f"| {r['raw-tcp']:.2f} | {r['zmq-ipc']:.2f} | {r['zmq-tcp']:.2f} | {r['gloo']:.2f} "
        f"| {r['zmq-tcp'] / r['raw-tcp']:.0%} | {r['raw-tcp cpu']:.2f} | {r['zmq-tcp cpu']:.2f} |"
    )


def machine_line() -> str:
    import msgpack
    import zmq

    return bench_report.machine_line(
        f"torch {torch.__version__}",
        f"pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()})",
        f"msgpack {'.'.join(map(str, msgpack.version))}",
    )


def markdown_section(args, rows: list[dict]) -> str:
    commit = bench_report.git_commit()
    big = [r for r in rows if r["frame"] >= 2**20]  # runs of 1 MiB and more
    verdict = ", ".join(f"{r['zmq-tcp'] / r['raw-tcp']:.0%}" for r in big)
    met = big and all(r["zmq-tcp"] >= 0.7 * r["raw-tcp"] for r in big)
    return "\n".join([
        f"## KV transfer bandwidth, {datetime.datetime.now():%Y-%m-%d %H:%M} (`scripts/bench_kvtransfer.py`)",
        "",
        f"- Command: `python {' '.join(sys.argv)}` (commit {commit})",
        f"- Machine: {machine_line()}",
        f"- KV: {args.layers} layers, {args.kv_heads} KV heads x {args.head_dim}, {args.dtype}; "
        f"median of {args.reps} reps after one warm-up, reps interleaved across transports; "
        "GB/s = 1e9 bytes/s of K+V moved, "
        "timed from the first send until the sender sees the receiver's done",
        "- Baseline: raw TCP socket on 127.0.0.1, same bytes in frames of the same size, same run",
        "- CPU s/GB: user + system seconds of the sending and the receiving process together, per GB moved",
        "",
        HEADER,
        *[table_row(r) for r in rows],
        "",
        f"Target ZMQ-TCP >= 70% of raw loopback, rows with runs >= 1 MiB: {verdict} -> "
        f"{'met' if met else '**not met**'}.",
        "",
    ])  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--block-sizes", type=int, nargs="+", default=[16, 64], help="tokens per block")
    p.add_argument("--run-lengths", type=int, nargs="+", default=[1, 8, 64], help="consecutive blocks per frame")
    p.add_argument("--transfer-mib", type=int, default=64, help="KV bytes per request (all layers, K+V)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--reps", type=int, default=7)
    bench_report.add_markdown_option(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    print(HEADER, flush=True)
    rows = run(args)
    if args.markdown:
        history = bench_report.record_run(args.markdown, "bench_kvtransfer.py", markdown_section(args, rows))
        print(f"results in {history}, and as the latest in {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
