"""Messages for one thread from any other: a queue plus a file descriptor that a poller can wait on.

The owning thread adds `fd` to its `zmq.Poller` beside its sockets, so one
blocking poll wakes on whichever comes first: a socket, a message here, or
its next deadline. Never a spin, never a sleep.
"""

from __future__ import annotations

import collections
import os

STOP = object()  # what a thread's owner posts to end it (`IOThread.stop`, `WorkerLoop.stop`)


class Mailbox:
    def __init__(self):
        self._items: collections.deque = collections.deque()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self.closed = False

    @property
    def fd(self) -> int:
        """Readable while messages wait (the owner's poller watches it)."""
        return self._read_fd

    def put(self, message) -> None:
        """From any thread. deque.append is atomic; the byte wakes the owner's poll."""
        self._items.append(message)
        try:
            os.write(self._write_fd, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or closed (the owner is gone)

    def take_all(self) -> list:
        """On the owning thread: every message waiting, oldest first."""
        try:
            while os.read(self._read_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self._read_fd)
            os.close(self._write_fd)
