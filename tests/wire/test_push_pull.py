"""Pushers keep no socket to a destination that is gone: a full queue closes it, and the least recently used
goes once too many are open (a decode worker that restarts binds a new inbox each time)."""

from __future__ import annotations

import socket

from wire.push_pull import PullSocket, Pushers
from wire.requests import FirstToken


def _unbound_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def _received(inbox: PullSocket, count: int) -> list:
    got = []
    for _ in range(200):
        got.extend(inbox.poll(50))
        if len(got) >= count:
            break
    return got


def test_a_destination_whose_queue_is_full_loses_its_socket():
    pushers = Pushers(send_hwm=1)
    gone = _unbound_address()  # nobody reads there: its queue fills at the high-water mark
    sent = 0
    while pushers.send(gone, FirstToken("r", sent)):
        sent += 1
        assert sent < 100, "a full queue must refuse a send"
    assert pushers.destinations == ()  # closed with what it had queued: nobody would have read it
    inbox = PullSocket((FirstToken,))
    assert pushers.send(inbox.address, FirstToken("r", 2)) and _received(inbox, 1) == [FirstToken("r", 2)]
    pushers.close()
    inbox.close()


def test_at_most_max_destinations_stay_open_the_least_recently_used_closed_first():
    inboxes = [PullSocket((FirstToken,)) for _ in range(3)]
    pushers = Pushers(max_destinations=2)
    a, b, c = (inbox.address for inbox in inboxes)
    for i, address in enumerate((a, b, a, c)):
        assert pushers.send(address, FirstToken(f"r{i}", i))
    assert pushers.destinations == (a, c)  # b was the least recently used
    assert [m.request_id for m in _received(inboxes[1], 1)] == ["r1"]  # what it had queued still went out
    assert pushers.send(b, FirstToken("again", 9)) and pushers.destinations == (c, b)
    assert [m.request_id for m in _received(inboxes[1], 1)] == ["again"]
    pushers.close()
    for inbox in inboxes:
        inbox.close()
