from cluster.restart_backoff import next_streak, restart_delay
from cluster.spec import HealthSpec

HEALTH = HealthSpec(restart_backoff_s=1.0, restart_backoff_max_s=5.0, stable_after_s=60.0)


def test_a_worker_that_lived_long_is_restarted_at_once():
    streak = next_streak(3, lived_s=61.0, health=HEALTH)
    assert streak == 0 and restart_delay(streak, HEALTH) == 0.0


def test_quick_deaths_in_a_row_double_the_wait_up_to_the_cap():
    streak, delays = 0, []
    for _ in range(5):
        streak = next_streak(streak, lived_s=2.0, health=HEALTH)
        delays.append(restart_delay(streak, HEALTH))
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
