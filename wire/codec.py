"""One generic msgpack codec for the frozen dataclass messages of `wire`.

Wire form of a message: msgpack ext type 1 wrapping `[type name, field values...]`,
fields in declaration order. Nested registered dataclasses use the same ext
type, so a message may carry another message. Sequences decode as tuples (the
dataclasses are frozen). Never pickle: only registered types can be built, and
a payload that is not exactly one of them raises `DecodeError`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

import msgpack

_EXT_MESSAGE = 1
_REGISTRY: dict[str, type] = {}

T = TypeVar("T")


class DecodeError(ValueError):
    """Bytes that are not a well-formed registered message (malformed, truncated, unknown)."""

    reason = "malformed"  # the socket_security refusal counter it goes to


class WrongType(DecodeError):
    """A well-formed message, but not one of the types the reader expects."""

    reason = "wrong_type"


def message(cls: type[T]) -> type[T]:
    """Class decorator: make `cls` a frozen dataclass and register it for the codec."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    if cls.__name__ in _REGISTRY:
        raise TypeError(f"message type {cls.__name__} registered twice")
    _REGISTRY[cls.__name__] = cls
    return cls


def encode(msg: Any) -> bytes:
    return msgpack.packb(msg, default=_to_ext, use_bin_type=True)


def decode(data, expected: type[T] | tuple[type, ...] = object) -> T:
    """Decode one message; raise `DecodeError` if it is malformed or not of the `expected` type."""
    try:
        msg = msgpack.unpackb(data, ext_hook=_from_ext, raw=False, use_list=False, strict_map_key=True)
    except DecodeError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"malformed message: {e}") from e
    if not isinstance(msg, expected) or not dataclasses.is_dataclass(msg):
        raise WrongType(f"expected {_names(expected)}, got {type(msg).__name__}")
    return msg


def _to_ext(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, int):  # msgpack hands over the integers it cannot pack: a request's value, not a bug
        raise ValueError(f"integer {obj} is outside the 64-bit range a message can carry")
    name = type(obj).__name__
    if _REGISTRY.get(name) is not type(obj):
        raise TypeError(f"{name} is not a registered message type; decorate it with @message")
    values = [getattr(obj, f) for f in _field_names(type(obj))]
    return msgpack.ExtType(_EXT_MESSAGE, msgpack.packb([name, *values], default=_to_ext, use_bin_type=True))


def _from_ext(code: int, data: bytes) -> Any:
    if code != _EXT_MESSAGE:
        raise DecodeError(f"unknown ext type {code}")
    name, *values = msgpack.unpackb(data, ext_hook=_from_ext, raw=False, use_list=False)
    cls = _REGISTRY.get(name)
    if cls is None:
        raise DecodeError(f"unknown message type {name!r}")
    fields = dataclasses.fields(cls)
    if len(values) != len(fields):
        raise DecodeError(f"{name}: expected {len(fields)} fields, got {len(values)}")
    for f, value, conforms in zip(fields, values, _checkers(cls)):
        if not conforms(value):
            raise DecodeError(f"{name}.{f.name}: {type(value).__name__} does not match {_hints(cls)[f.name]}")
    return cls(*values)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _checkers(cls: type) -> tuple:
    """One type check per field, in declaration order, built once per message type."""
    return tuple(_checker(_hints(cls)[f.name]) for f in dataclasses.fields(cls))


def _checker(hint: Any):
    """A shallow-but-recursive check of a decoded value against a field's annotation."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return lambda value: True
    if origin in (typing.Union, types.UnionType):
        options = tuple(_checker(h) for h in typing.get_args(hint))
        return lambda value: any(check(value) for check in options)
    if hint is type(None):
        return lambda value: value is None
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _checker(args[0])
            if args[0] is int:  # token ids: the hot case, checked without a call per item
                return lambda value: isinstance(value, tuple) and all(type(v) is int for v in value)
            return lambda value: isinstance(value, tuple) and all(item(v) for v in value)
        items = tuple(_checker(a) for a in args)
        return lambda value: isinstance(value, tuple) and len(items) == len(value) and all(
            check(v) for check, v in zip(items, value)
        )
    if hint is float:
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    return lambda value: isinstance(value, hint)


def _names(expected) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(t.__name__ for t in types)
