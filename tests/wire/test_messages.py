"""Every message type of every channel round-trips the one codec, nested messages and tuples included."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

import wire
from wire import codec


def _example(hint):
    """A value of the annotated type that no default equals (so a dropped field shows)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _example(next(a for a in args if a is not type(None)))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return (_example(args[0]), _example(args[0]))
        return tuple(_example(a) for a in args)
    if dataclasses.is_dataclass(hint):
        return _instance(hint)
    return {int: 7, float: 0.25, str: "x-é", bool: True, bytes: b"\x00\xff"}[hint]


def _instance(cls):
    hints = typing.get_type_hints(cls)
    return cls(*(_example(hints[f.name]) for f in dataclasses.fields(cls)))


MESSAGE_TYPES = sorted(codec._REGISTRY.values(), key=lambda cls: cls.__name__)


def test_every_channel_registers_its_messages():
    names = {cls.__name__ for cls in MESSAGE_TYPES}
    assert {"Hello", "KVChunk", "GenerateRequest", "TokenDelta", "ControlCall", "ShardOrders", "StepHeader"} <= names
    modules = {cls.__module__ for cls in MESSAGE_TYPES}
    assert modules == {"wire.kv", "wire.requests", "wire.control", "wire.membership", "wire.ranks", "wire.step"}, modules
    assert wire.kv and wire.step  # importing the package registered all of them


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda cls: cls.__name__)
def test_message_round_trips_the_one_codec(cls):
    msg = _instance(cls)
    back = codec.decode(codec.encode(msg), cls)
    assert back == msg and type(back) is cls
    for name in (f.name for f in dataclasses.fields(cls)):
        assert type(getattr(back, name)) is type(getattr(msg, name)), name  # bytes stay bytes, tuples tuples


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda cls: cls.__name__)
def test_message_read_as_another_type_is_refused(cls):
    other = next(t for t in MESSAGE_TYPES if t is not cls)
    with pytest.raises(codec.WrongType):
        codec.decode(codec.encode(_instance(cls)), other)
