"""An idle engine's first step is held while prompts keep arriving, never once requests are running, and
never longer than the window allows."""

from __future__ import annotations

from runtime.arrival_window import ArrivalWindow, ArrivalWindowConfig

CONFIG = ArrivalWindowConfig(quiet_s=0.010, max_hold_s=0.030)


def test_a_burst_is_held_until_it_goes_quiet():
    window = ArrivalWindow(CONFIG)
    window.arrived(100.000, engine_busy=False)
    assert window.hold_until(100.001) == 100.010
    window.arrived(100.008, engine_busy=False)  # another prompt: the quiet time starts again
    assert window.hold_until(100.009) == 100.018
    assert window.hold_until(100.018) is None  # quiet: step now, and the window is closed
    assert window.hold_until(100.019) is None


def test_a_steady_stream_is_held_at_most_max_hold():
    window = ArrivalWindow(CONFIG)
    for i in range(10):
        window.arrived(100.0 + i * 0.005, engine_busy=False)
    assert window.hold_until(100.045) is None  # 30 ms after the first, however many keep coming


def test_nothing_is_held_while_the_engine_runs_requests_or_when_turned_off():
    busy = ArrivalWindow(CONFIG)
    busy.arrived(100.0, engine_busy=True)
    assert busy.hold_until(100.0) is None and busy.deadline(None) is None
    off = ArrivalWindow(ArrivalWindowConfig(max_hold_s=0))
    off.arrived(100.0, engine_busy=False)
    assert off.hold_until(100.0) is None


def test_the_hold_is_the_loops_next_deadline_when_it_comes_first():
    window = ArrivalWindow(ArrivalWindowConfig(quiet_s=60.0, max_hold_s=120.0))
    assert window.deadline(5.0) == 5.0 and window.deadline(None) is None
    import time

    now = time.monotonic()
    window.arrived(now, engine_busy=False)
    assert window.deadline(None) == now + 60.0
    assert window.deadline(now + 1.0) == now + 1.0
