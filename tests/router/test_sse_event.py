"""One server-sent event per payload, whatever characters its text holds."""

from __future__ import annotations

import json

import httpx

from router.sse_stream import event


def test_an_event_is_one_line_to_a_reader_that_splits_lines_like_str_splitlines():
    text = "a\x85b\u2028c\u2029d\x1ce\nf\rg é"  # what a model may emit, line breaks of every kind among them
    framed = event({"choices": [{"text": text}]})
    lines = list(httpx.Response(200, content=framed).iter_lines())  # httpx splits as str.splitlines does
    assert lines == [lines[0], ""] and lines[0].startswith("data: ")
    assert json.loads(lines[0][6:]) == {"choices": [{"text": text}]}
    assert "é".encode() in framed  # other characters are written as they are, not escaped
