"""The msgpack codec builds only registered messages; the handshake check names what differs."""

from __future__ import annotations

import pickle

import msgpack
import pytest

from wire.codec import DecodeError, decode, encode, message
from kvtransfer.handshake import IncompatiblePeerError, check_hello
from wire.kv import PROTOCOL_VERSION, Heartbeat, Hello, KVChunk, KVSpec, TransferDone, compat_hash
from wire.requests import GenerateRequest, SamplingSpec

SPEC = KVSpec("m", "bfloat16", block_size=16, num_layers=4, num_kv_heads=4, head_dim=64)


def _hello(spec: KVSpec = SPEC, tp_size: int = 1, version: int = PROTOCOL_VERSION) -> Hello:
    return Hello(version, compat_hash(spec), spec, tp_size, 0, "p0", "zmq")


def test_messages_round_trip_with_nesting_and_tuples():
    for msg in (
        _hello(),
        KVChunk("req-1", 3, ((4, 2), (9, 1)), head_start=1, num_heads=2, dist_tag=7),
        Heartbeat(("a", "b")),
        Heartbeat(()),
    ):
        assert decode(encode(msg)) == msg


def test_decode_rejects_what_is_not_exactly_a_registered_message():
    good = encode(KVChunk("r", 0, ((0, 1),), 0, 1))
    bad_inputs = [
        good[: len(good) // 2],  # truncated
        b"\xc1garbage",  # not msgpack
        msgpack.packb({"request_id": "r"}),  # plain data, not a message
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["Nope", 1]))),  # unknown type
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["TransferDone"]))),  # missing field
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["TransferDone", 5]))),  # wrong field type
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["KVChunk", "r", 0, [["x", 1]], 0, 1, 0]))),
        pickle.dumps(TransferDone("r")),  # never unpickled
        encode(GenerateRequest("r", (1, "x"), SamplingSpec(), "a")),  # a token id that is no int
        encode(GenerateRequest("r", (1, True), SamplingSpec(), "a")),  # nor a bool
    ]
    for data in bad_inputs:
        with pytest.raises(DecodeError):
            decode(data)
    with pytest.raises(DecodeError, match="expected Heartbeat"):
        decode(good, Heartbeat)


def test_only_registered_dataclasses_encode():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class NotAMessage:
        x: int

    with pytest.raises(TypeError, match="not a registered message"):
        encode(NotAMessage(1))
    with pytest.raises(TypeError, match="registered twice"):
        message(type("TransferDone", (), {"__annotations__": {"request_id": str}}))


def test_an_integer_beyond_64_bits_is_the_requests_fault_not_a_worker_failure():
    """A ValueError (the request's fault: HTTP 400, the worker stays in its pool), not a TypeError."""
    for top_k in (2**64, 2**70):  # in top_k's range (a seed that large is refused by SamplingSpec itself)
        with pytest.raises(ValueError, match="outside the 64-bit range"):
            encode(GenerateRequest("r", (1, 2), SamplingSpec(top_k=top_k), "tcp://127.0.0.1:1"))


def test_compat_hash_changes_with_every_field():
    fields = {"model": "other", "dtype": "float16", "block_size": 32, "num_layers": 5, "num_kv_heads": 8,
              "head_dim": 128, "layout": "other-layout"}  # fmt: skip
    hashes = {compat_hash(SPEC)} | {compat_hash(KVSpec(**{**SPEC.__dict__, k: v})) for k, v in fields.items()}
    assert len(hashes) == len(fields) + 1


def test_check_hello_names_the_mismatch():
    check_hello(_hello(), SPEC, local_tp=2)
    other = KVSpec(**{**SPEC.__dict__, "dtype": "float16"})
    with pytest.raises(IncompatiblePeerError, match="dtype: peer 'float16' != ours 'bfloat16'"):
        check_hello(_hello(other), SPEC, local_tp=1)
    with pytest.raises(IncompatiblePeerError, match="protocol version"):
        check_hello(_hello(version=PROTOCOL_VERSION + 1), SPEC, local_tp=1)
    with pytest.raises(ValueError, match="TP size 3"):
        check_hello(_hello(tp_size=3), SPEC, local_tp=1)
