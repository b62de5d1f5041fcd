"""Leases expire exactly when not renewed in time, on an injected clock."""

import pytest

from kvtransfer.lease import LeaseTable


def test_renewal_extends_and_expiry_is_final():
    now = [0.0]
    leases = LeaseTable(10.0, clock=lambda: now[0])
    leases.grant("a")
    leases.grant("b")
    now[0] = 8.0
    assert leases.renew("a") and leases.pop_expired() == []
    now[0] = 10.0
    assert leases.pop_expired() == ["b"]  # b was never renewed
    assert not leases.renew("b") and "b" not in leases  # an expired lease stays expired
    now[0] = 17.9
    assert leases.pop_expired() == []
    leases.release("a")
    now[0] = 100.0
    assert leases.pop_expired() == []


def test_duration_must_be_positive():
    with pytest.raises(ValueError):
        LeaseTable(0.0)
