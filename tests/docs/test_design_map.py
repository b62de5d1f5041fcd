"""docs/DESIGN.md's sockets-and-channels table and its threads stay true to the code.

The map is read by newcomers before the code; these checks fail when a socket or a thread is added where
the map does not say, a message it names is renamed, or a module it points at moves.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
PACKAGES = ("cluster", "costmodel", "decode_worker", "engine", "kvtransfer", "output_text", "planner",
            "prefill_worker", "router", "runtime", "wire")  # fmt: skip
SOCKET_TYPE = re.compile(r"zmq\.(ROUTER|DEALER|PUSH|PULL|PUB|SUB|REQ|REP|PAIR)\b")
THREAD_START = re.compile(r"threading\.Thread\(|ThreadPoolExecutor\(")
# Threads that are no part of a serving process's standing structure, each with why.
SHORT_LIVED_THREADS = {
    "engine/hub_source.py": "one probe of the model hub's reachability at load time, joined with a timeout",
    "cluster/calibration_client.py": "`tandem profile --serving`'s client threads, one per request it sends",
    "cluster/calibration_beside.py": "`tandem profile --serving`'s one background stream while its probes are sent",
}


def _channel_rows() -> list[dict[str, str]]:
    text = DESIGN.read_text()
    section = text[text.index("## Sockets and channels"):].splitlines()
    start = next(i for i, line in enumerate(section) if line.startswith("|"))
    end = next((i for i in range(start, len(section)) if not section[i].startswith("|")), len(section))
    lines = section[start:end]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def _code_paths(cell: str) -> list[str]:
    """The modules a row's code cell names; a bare file name is in the folder of the path before it."""
    paths, folder = [], ""
    for name in re.findall(r"`([\w/]+\.py)`", cell):
        if "/" in name:
            folder = name.rsplit("/", 1)[0]
        paths.append(name if "/" in name else f"{folder}/{name}")
    return paths


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def test_every_module_the_channel_table_names_exists():
    rows = _channel_rows()
    assert len(rows) >= 10, "the channel table was not found"
    named = [path for row in rows for path in _code_paths(row["code"])]
    assert named and not [path for path in named if not (ROOT / path).is_file()]


def test_every_message_the_channel_table_names_is_a_registered_wire_message():
    import wire  # noqa: F401  (registers every message type)
    from wire.codec import _REGISTRY

    carried = {name for row in _channel_rows() for span in re.findall(r"`([^`]+)`", row["carries"])
               for name in re.findall(r"\b[A-Z][A-Za-z]*[a-z][A-Za-z]*\b", span)}  # fmt: skip
    assert {"TokenDelta", "ControlCall", "KVChunk"} <= carried
    assert sorted(carried - set(_REGISTRY)) == []


def test_every_module_that_makes_a_zmq_socket_is_in_the_channel_table():
    named = {path for row in _channel_rows() for path in _code_paths(row["code"])}
    named.add("wire/socket_security.py")  # the one factory, named above the table
    makers = {path for path, source in _sources().items() if SOCKET_TYPE.search(source)}
    assert makers, "no ZMQ socket found: the pattern is stale"
    assert sorted(makers - named) == []


def test_every_module_that_starts_a_thread_is_on_the_map():
    text = DESIGN.read_text()
    starters = {path for path, source in _sources().items() if THREAD_START.search(source)}
    assert "runtime/io_thread.py" in starters
    unnamed = {path for path in starters - set(SHORT_LIVED_THREADS) if path not in text}
    assert sorted(unnamed) == []
    assert set(SHORT_LIVED_THREADS) <= starters, "a listed short-lived thread is gone: drop it from the list"
