"""The tensor-parallel ranks meet at a store that listens on the rendezvous address alone."""

from __future__ import annotations

import socket
from datetime import timedelta

import psutil

from engine.parallel.config import ParallelConfig
from engine.parallel.group import _rendezvous_store


def test_rank_zeros_store_listens_on_its_host_only_and_the_others_reach_it():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeout = timedelta(seconds=10)
    master = _rendezvous_store("127.0.0.1", port, ParallelConfig(2, 0, f"127.0.0.1:{port}"), timeout)
    listening = [c.laddr for c in psutil.Process().net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]  # fmt: skip
    assert [a.ip for a in listening] == ["127.0.0.1"]  # not 0.0.0.0 / :: (torch's own default)
    other = _rendezvous_store("127.0.0.1", port, ParallelConfig(2, 1, f"127.0.0.1:{port}"), timeout)
    master.set("rank0", "here")
    assert other.get("rank0") == b"here"
