"""An echo worker behind the real control service (on a real I/O thread), for the control channel's tests."""

from __future__ import annotations

import threading


from wire.requests import WorkerLoad
from runtime.control_service import ControlService, request_id_arg
from runtime.io_thread import IOThread
from runtime.load_board import LoadBoard, LoopSnapshot
from runtime.loop import CallsOnlyWorker

ECHO_LOAD = WorkerLoad("echo", 1, 2, 0, 30, 40, 0.5)


class EchoWorker(CallsOnlyWorker):
    """Answers `echo` calls; `hold` blocks until `release` is set (from another call, or the test)."""

    load = ECHO_LOAD

    def __init__(self):
        self.release = threading.Event()
        self.aborted: list[str] = []

    def echo(self, text: str) -> str:
        if text.startswith("hold"):
            self.release.wait(10)
        if text == "release":
            self.release.set()
        if text == "fail":
            raise RuntimeError("the worker broke")
        return text.upper()

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _echo_arg(text):
    if not isinstance(text, str):
        raise ValueError("echo takes a string")
    return text


CALLS = {"echo": _echo_arg, "abort": request_id_arg}


class Server:
    """A control service on its own I/O thread, delivering calls to `deliver`."""

    def __init__(self, deliver, max_message_bytes: int = 16 << 20, address: str = "tcp://127.0.0.1:0",
                 router_key: str = ""):  # fmt: skip
        self.board = LoadBoard("echo")
        self.board.publish(LoopSnapshot(ECHO_LOAD, True, True))
        self.io = IOThread("echo-io", lambda io: [ControlService(self.board, CALLS, deliver, io.post, address,
                                                                 max_message_bytes, router_key)])  # fmt: skip
        self.service = self.io.services[0]
        self.address = self.service.address

    @property
    def rejected(self) -> int:
        return self.service.rejected

    @property
    def dropped(self) -> int:
        return self.service.dropped

    def close(self) -> None:
        """Its socket closes, as when the worker's process dies."""
        self.io.stop()
