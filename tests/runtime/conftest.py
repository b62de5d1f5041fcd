"""Fixtures of the control channel's tests: an echo worker, served on a worker loop or a thread pool."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.load_board import LoadBoard
from runtime.loop import WorkerLoop
from tests.runtime.echo import EchoWorker, Server


@pytest.fixture
def worker():
    w = EchoWorker()
    yield w
    w.release.set()


@pytest.fixture
def looped(worker):
    """A server in front of `worker` on a real worker loop."""
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    server = Server(loop.post)
    yield server
    server.close()
    loop.stop()


@pytest.fixture
def pooled(worker):
    """A server whose calls run on two threads, so they may finish in any order."""
    with ThreadPoolExecutor(2) as pool:
        server = Server(lambda call: pool.submit(worker.handle, call))
        yield server
        server.close()
        worker.release.set()
