"""A socket monitor nobody reads must not stop the process's other sockets.

libzmq's I/O thread blocks when a monitor's queue is full; a control client retrying a worker that is
gone emits an event per retry. `open_monitor` gives the queue no bound: unread events cost memory only.
"""

from __future__ import annotations

import time

import zmq

from wire.socket_security import open_monitor


def test_an_unread_monitor_of_a_socket_retrying_a_dead_peer_never_blocks_other_sockets():
    ctx = zmq.Context()
    retrying = ctx.socket(zmq.DEALER)
    retrying.setsockopt(zmq.RECONNECT_IVL, 1)  # a thousand retries (and monitor events) a second
    monitor = open_monitor(retrying, zmq.EVENT_ALL)  # never read
    retrying.connect("tcp://127.0.0.1:1")  # nobody listens there
    time.sleep(2)
    server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client.connect(f"tcp://127.0.0.1:{port}")
    client.send(b"still served")
    try:
        assert server.poll(5000) and server.recv_multipart()[1] == b"still served"
        assert monitor.poll(0)  # the events are all there, unread
    finally:
        for sock in (retrying, monitor, server, client):
            sock.close(linger=0)
        ctx.term()
