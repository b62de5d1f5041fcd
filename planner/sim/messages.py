"""What moves between the simulated router and workers: the handoff's messages (`wire.requests`'s), reduced
to what simulated time needs. Each is delivered after the profile's hop time (`ServingCost.message_s`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reserve:  # router -> decode (GenerateRequest on the `reserve` call)
    request_id: str
    prompt: tuple[int, ...]
    output_len: int
    local_prefill: bool  # no prefill worker could take it: decode prefills it whatever its threshold


@dataclass(frozen=True)
class Reserved:  # decode -> router (DecodeReservation)
    prefill_locally: bool
    uncached_tokens: int = 0  # prompt tokens whose KV the prefill worker must send


@dataclass(frozen=True)
class Refused:  # decode -> router (ReserveRefused)
    reason: str
    retryable: bool


@dataclass(frozen=True)
class Prefill:  # router -> prefill (PrefillTask)
    request_id: str
    prompt: tuple[int, ...]
    output_len: int
    decode: object  # the decode SimWorker that reserved its blocks
    uncached_tokens: int


@dataclass(frozen=True)
class FirstToken:  # prefill -> decode inbox
    request_id: str
    token_id: int


@dataclass(frozen=True)
class KVLanded:  # decode's receiver: every block of the request is in
    request_id: str


@dataclass(frozen=True)
class TransferDone:  # decode's receiver -> prefill's sender: its held blocks may go
    request_id: str
