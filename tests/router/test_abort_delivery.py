"""An abort the dispatcher sends while a worker's control connection is down is not lost: the worker gets it once
the connection is back (real control sockets on loopback, the real worker loop behind them)."""

from __future__ import annotations

import asyncio

from router.attempt import Attempt
from router.control_client import control_endpoint
from router.dispatch import Dispatcher
from router.policy import make_policy
from router.registry import WorkerFailed, WorkerRegistry
from router.token_stream import TokenStreamConsumer
from runtime.load_board import LoadBoard
from runtime.loop import WorkerLoop
from tests.runtime.echo import EchoWorker, Server


async def _until(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_an_abort_sent_while_the_worker_is_unreachable_reaches_it_once_it_is_back():
    worker = EchoWorker()
    loop = WorkerLoop("echo", LoadBoard("echo"), lambda deliver: worker)
    server = Server(loop.post)
    address = server.address

    async def load_fails(decode) -> bool:
        try:
            await asyncio.wait_for(decode.endpoint.load(), 1.0)
        except WorkerFailed:
            return True
        except asyncio.TimeoutError:
            pass
        return False

    async def main():
        nonlocal server
        registry = WorkerRegistry(make_policy("round_robin"))
        decode = registry.register("decode-0", "decode", control_endpoint(address))
        dispatcher = Dispatcher(registry, TokenStreamConsumer(), colocated=True)
        await decode.endpoint.load()  # connected
        server.close()  # the connection drops; the worker's process would still be generating
        await _until(lambda: load_fails(decode), "the connection to be down")
        dispatcher.abort(Attempt("r-1", decode, None, 3))  # the client went away meanwhile
        await dispatcher.drain_aborts()
        lost_so_far = list(worker.aborted)
        server = Server(loop.post, address=address)  # the connection comes back
        await _until(lambda: _true(worker.aborted == ["r-1"]), "the abort to reach the worker")
        decode.endpoint.close()
        return lost_so_far, decode.alive

    try:
        lost_so_far, alive = asyncio.run(main())
    finally:
        server.close()
        loop.stop()
    assert lost_so_far == [] and alive


async def _true(value: bool) -> bool:
    return value
