"""The abuse table of RELIABILITY.md: hostile request bodies against `tandem serve` with its defaults, each
sent while a streamed request runs beside it; what each is answered, how fast, and how long the stream
beside it went without a token meanwhile.

    python scripts/abuse_table.py            # replaces the table between the abuse markers of RELIABILITY.md

tests/e2e/test_request_limits.py sends the same bodies (`ABUSE`, `TOKENIZE_ABUSE`, `EXTRA_ABUSE`) to a router
over a tiny model.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_loads import SERVED_NAME, restarts, tandem_serve  # noqa: E402
from bench_report import git_commit, machine_line  # noqa: E402

# name -> (body without model and max_tokens, the field its 400 names)
ABUSE = {
    "100,000 stop strings": ({"prompt": "hi", "stop": [f"s{i}" for i in range(100_000)]}, "stop"),
    "a stop string of 5,000 characters": ({"prompt": "hi", "stop": ["x" * 5000]}, "stop"),
    "100,000 stop token ids": ({"prompt": "hi", "stop_token_ids": list(range(100_000))}, "stop_token_ids"),
    "a stop token id past the vocabulary": ({"prompt": "hi", "stop_token_ids": [10**6]}, "stop_token_ids"),
    "5,000 prompts": ({"prompt": ["hi"] * 5000}, "prompt"),
    "100 prompts x n 100": ({"prompt": ["hi"] * 100, "n": 100}, "n"),
    "a token-id prompt of 1,000,000 ids (6.8 MiB)": ({"prompt": [7] * 1_000_000}, "prompt"),
    "a lone surrogate in the prompt": ({"prompt": "a\ud800b"}, "prompt"),
    "a text prompt of 6,000,000 characters": ({"prompt": "hello world " * 500_000}, "prompt"),
    "n 100,000": ({"prompt": "hi", "n": 100_000}, "n"),
    "5,000 logit_bias entries": ({"prompt": "hi", "logit_bias": {str(i): 1 for i in range(5000)}}, "logit_bias"),
}
# The same, to /v1/chat/completions.
CHAT_ABUSE = {
    "100,000 chat messages": ({"messages": [{"role": "user", "content": "a"}] * 100_000}, "messages"),
}
# Beside the API: vLLM's /tokenize and /detokenize (no max_tokens), the same bounds.
TOKENIZE_ABUSE = {
    "/tokenize of 100,000 chat messages": ({"messages": [{"role": "user", "content": "a"}] * 100_000}, "messages",
                                           "/tokenize"),  # fmt: skip
    "/tokenize of a text of 6,000,000 characters": ({"prompt": "hello world " * 500_000}, "prompt", "/tokenize"),
    "/detokenize of 1,000,000 ids": ({"tokens": [7] * 1_000_000}, "tokens", "/detokenize"),
}


def _deep_schema(depth: int) -> str:
    """A JSON schema nested `depth` objects deep, as text (json.dumps of the dicts would recurse as deep)."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


_HELLO = [{"role": "user", "content": "hi"}]
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# What the extra fields let a body ask for (issue 30), to either endpoint; status 200 where the work is
# legitimate and must only not stall anyone: (body, the field its 400 names or None for a 200, path).
EXTRA_ABUSE = {
    "20,000 tools": ({"messages": _HELLO, "tools": [_TOOL] * 20_000}, "tools", "/v1/chat/completions"),
    "a JSON schema nested 5,000 deep": ({"prompt": "hi", "guided_json": _deep_schema(5000)}, "guided_json",
                                        "/v1/completions"),  # fmt: skip
    "a grammar of 200,000 rules": ({"prompt": "hi", "guided_grammar": "root ::= r0\n" + "\n".join(
        f'r{i} ::= "a" r{i + 1} | "b"' for i in range(200_000)) + '\nr200000 ::= "c"'}, "guided_grammar",
        "/v1/completions"),  # fmt: skip
    "100,000 guided choices": ({"prompt": "hi", "guided_choice": [f"c{i}" for i in range(100_000)]}, "guided_choice",
                               "/v1/completions"),  # fmt: skip
    "a regex xgrammar takes seconds to compile": ({"prompt": "hi", "guided_regex": "(a|aa)*" * 200 + "b"}, None,
                                                   "/v1/completions"),  # fmt: skip
    "a message's tool_calls of [1]": ({"messages": [{"role": "assistant", "content": "", "tool_calls": [1]},
                                                    *_HELLO]}, "messages", "/v1/chat/completions"),  # fmt: skip
    "a tool_choice whose function is a string": ({"messages": _HELLO, "tools": [_TOOL], "tool_choice": {
        "type": "function", "function": "f"}}, "tool_choice", "/v1/chat/completions"),  # fmt: skip
    "tool_choice auto with a guided_regex of 4,000 spaces": ({"messages": _HELLO, "tools": [_TOOL], "tool_choice":
        "auto", "guided_regex": " {4000}"}, "tool_choice", "/v1/chat/completions"),  # fmt: skip
    "a cache_salt that is a number": ({"prompt": "hi", "cache_salt": 5}, "cache_salt", "/v1/completions"),
    "logprobs 20 of 300 tokens x n 4, not streamed": ({"prompt": "hi", "logprobs": 20, "max_tokens": 300, "n": 4,
                                                        "ignore_eos": True}, None, "/v1/completions"),  # fmt: skip
}
DEEP_JSON = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
NINE_MIB = b'{"model": "m", "prompt": "' + b"a" * (9 << 20) + b'"}'  # past the 8 MiB body limit: 413
STREAM_TOKENS = 6000  # the stream beside: long enough to outlast every row
MARKERS = ("<!-- abuse:latest -->", "<!-- /abuse:latest -->")


def request_bytes(body: dict | bytes, model: str, path: str) -> bytes:
    """The body as sent to `path`: bytes as they are; a dict naming `model`, with `max_tokens: 2` unless it says
    otherwise or the path generates nothing (/tokenize, /detokenize)."""
    if isinstance(body, bytes):
        return body
    limit = {} if path in ("/tokenize", "/detokenize") else {"max_tokens": 2}
    return json.dumps({"model": model, **limit, **body}).encode()


def post(url: str, body: dict | bytes, model: str, path: str = "/v1/completions") -> tuple[int, str, float]:
    """(status, the error's param or "", seconds to the answer)."""
    content = request_bytes(body, model, path)
    request = urllib.request.Request(f"{url}{path}", data=content, headers={"content-type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, "", time.perf_counter() - start
    except urllib.error.HTTPError as err:
        took = time.perf_counter() - start
        return err.code, (json.loads(err.read()).get("error") or {}).get("param") or "", took


class Stream(threading.Thread):
    """A streamed completion beside the abuse: the times its chunks arrived."""

    def __init__(self, url: str, model: str):
        super().__init__(daemon=True)
        self.url, self.model, self.arrivals = url, model, []

    def run(self):
        body = {"model": self.model, "prompt": "Count from one to a thousand:", "max_tokens": STREAM_TOKENS,
                "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
        request = urllib.request.Request(f"{self.url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as reply:
            for line in reply:
                if line.startswith(b"data: {"):
                    self.arrivals.append(time.perf_counter())

    def longest_gap(self, start: float, end: float) -> float:
        """The longest wait for a chunk between `start` and `end` (including from start to the first one)."""
        times = [start] + [t for t in self.arrivals if start < t <= end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))


def _raw_stream(url: str, body: dict) -> socket.socket:
    """A streamed completion from a client that then reads nothing (a small receive buffer)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.connect((host, int(port)))
    data = json.dumps({"model": SERVED_NAME, "stream": True, **body}).encode()
    conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(data), data))  # fmt: skip
    return conn


def stalled_streams(url: str) -> tuple[str, float]:
    """Two streams of n 128 (the whole admission) that never read; then 20 requests, each retried on a 429
    as a client would (honouring Retry-After): how many were served, and the seconds until the last was."""
    stalled = [_raw_stream(url, {"prompt": "Tell me a story.", "n": 128, "max_tokens": 32}) for _ in range(2)]
    start = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            served = sum(pool.map(lambda _: _served_with_retries(url), range(20)))
        return f"{served} of 20 served", time.perf_counter() - start
    finally:
        for conn in stalled:
            conn.close()


def _served_with_retries(url: str, deadline_s: float = 120.0) -> bool:
    end = time.perf_counter() + deadline_s
    while time.perf_counter() < end:
        status, _, _ = post(url, {"prompt": "Hello", "max_tokens": 8}, SERVED_NAME)
        if status == 200:
            return True
        time.sleep(1.0)  # the router's Retry-After
    return False


def slow_connections(url: str) -> tuple[str, float]:
    """2,000 connections that each sent half a header; /health 20 times meanwhile: statuses, slowest answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    slow = []
    try:
        for _ in range(2000):
            slow.append(socket.create_connection((host, int(port))))
            slow[-1].sendall(b"GET /health HTTP/1.1\r\nHost: %s\r\nX-Slow: " % host.encode())
        answers, slowest = [], 0.0
        for _ in range(20):
            start = time.perf_counter()
            with urllib.request.urlopen(f"{url}/health", timeout=30) as reply:
                answers.append(reply.status)
            slowest = max(slowest, time.perf_counter() - start)
        return f"/health: {answers.count(200)} of 20 answered 200", slowest
    finally:
        for conn in slow:
            conn.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "RELIABILITY.md"))
    args = p.parse_args(argv)
    rows = ["| input | status | error names | time to answer (the slowest, for rows of many) | longest gap between "
            "tokens of the stream beside it |",
            "|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, tandem_serve(None, Path(tmp) / "serve.log") as url:
        stream = Stream(url, SERVED_NAME)
        stream.start()
        while not stream.arrivals:
            time.sleep(0.05)
        bodies = [*((n, b, "/v1/completions") for n, (b, _) in ABUSE.items()),
                  *((n, b, "/v1/chat/completions") for n, (b, _) in CHAT_ABUSE.items()),
                  ("JSON nested 100,000 deep", DEEP_JSON, "/v1/completions"),
                  ("a body of 9 MiB", NINE_MIB, "/v1/completions"),
                  *((n, b, path) for n, (b, _, path) in {**TOKENIZE_ABUSE, **EXTRA_ABUSE}.items())]  # fmt: skip
        for name, body, path in bodies:
            start = time.perf_counter()
            status, param, took = post(url, body, SERVED_NAME, path)
            time.sleep(0.2)  # the stream's pace just after it, too
            gap = stream.longest_gap(start, time.perf_counter())
            rows.append(f"| {name} | {status} | {param or '-'} | {took * 1000:.0f} ms | {gap * 1000:.0f} ms |")
            print(rows[-1], flush=True)
        for name, measure in (("2 streams of n 128 that never read, then 20 requests", stalled_streams),
                              ("2,000 connections that send half a header, then /health x 20", slow_connections)):
            start = time.perf_counter()
            outcome, took = measure(url)
            gap = stream.longest_gap(start, time.perf_counter())
            rows.append(f"| {name} | {outcome} | - | {took * 1000:.0f} ms | {gap * 1000:.0f} ms |")
            print(rows[-1], flush=True)
        stream.join(600)
        worker_restarts = restarts(url)
    # No `### ` heading: scripts/bench_faults.py keeps only what comes before the first one.
    text = (f"{MARKERS[0]}\n**`python scripts/abuse_table.py`**\n\nRun of {time.strftime('%Y-%m-%d %H:%M')}, commit "
            f"{git_commit()}, on {machine_line()}. `tandem serve` with its defaults; each body sent (with "
            f"`max_tokens: 2` unless it says otherwise) while a streamed completion of {STREAM_TOKENS:,} tokens ran; "
            f"worker restarts after all of them: {worker_restarts}.\n\n" + "\n".join(rows)
            + f"\n{MARKERS[1]}")  # fmt: skip
    out = Path(args.out)
    current = out.read_text()
    begin, end = current.find(MARKERS[0]), current.find(MARKERS[1])
    out.write_text(current[:begin] + text + current[end + len(MARKERS[1]):])


if __name__ == "__main__":
    main()
