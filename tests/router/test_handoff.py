"""The handoff's reserve: a full decode worker is asked again after a wait that doubles, up to a bound, so a
request waiting for room costs decode's loop a few prompt hashes a second, not fifty."""

from __future__ import annotations

import asyncio

import pytest

from router import handoff
from router.handoff import HandoffError, HandoffTimeouts, start_request
from wire.requests import DecodeReservation, GenerateRequest, ReserveRefused, SamplingSpec


class FullDecode:
    """Refuses `refusals` reserves (no free blocks), then takes the request to prefill itself."""

    def __init__(self, refusals: int, retryable: bool = True):
        self.refusals, self.retryable, self.asked = refusals, retryable, 0

    async def reserve(self, request: GenerateRequest):
        self.asked += 1
        if self.asked <= self.refusals:
            return ReserveRefused(request.request_id, "no free KV blocks", self.retryable)
        return DecodeReservation(request.request_id, prefill_locally=True)

    async def abort(self, request_id: str) -> None:
        pass


def _request() -> GenerateRequest:
    return GenerateRequest("r", (1, 2, 3), SamplingSpec(), "tcp://127.0.0.1:1")


def test_the_wait_between_reserves_doubles_up_to_its_bound():
    timeouts = HandoffTimeouts(reserve_retry_s=0.02, reserve_retry_max_s=0.5)
    assert [timeouts.retry_after(n) for n in range(1, 8)] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5])
    assert timeouts.retry_after(10_000) == 0.5  # no overflow however long a request waits


def test_a_full_decode_is_asked_again_after_each_wait_until_it_has_room(monkeypatch):
    waits = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(handoff.asyncio, "sleep", sleep)
    decode = FullDecode(refusals=4)
    reservation = asyncio.run(start_request(_request(), decode, None))
    assert reservation.prefill_locally and decode.asked == 5
    assert waits == pytest.approx([0.02, 0.04, 0.08, 0.16])
    with pytest.raises(HandoffError, match="decode refused") as refused:  # never fits: no retry at all
        asyncio.run(start_request(_request(), FullDecode(refusals=1, retryable=False), None))
    assert not refused.value.retryable and len(waits) == 4
