"""Backoff: the one formula for every wait after failures in a row (pure units)."""

from __future__ import annotations

import pytest

from delay_broker.backoff import Backoff


def test_ceilings_double_from_the_first_up_to_the_cap():
    backoff = Backoff()
    ceilings = []
    for _ in range(10):
        backoff = backoff.failed()
        ceilings.append(backoff.ceiling)
    assert ceilings == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    assert Backoff().ceiling == 0.0 and Backoff().wait() == 0.0


def test_waits_have_equal_jitter_between_half_the_ceiling_and_all_of_it():
    backoff = Backoff(failures=3)
    waits = [backoff.wait() for _ in range(2000)]
    assert min(waits) >= 0.2 and max(waits) <= 0.4
    assert min(waits) < 0.22 and max(waits) > 0.38, "drawn across the whole range"


def test_a_value_failed_and_reset_return_new_ones():
    backoff = Backoff(first=0.05, cap=1.0)
    after = backoff.failed().failed()
    assert (backoff.failures, after.failures, after.reset().failures) == (0, 2, 0)
    assert after.reset() == backoff
    assert Backoff(failures=10_000).ceiling == 10.0, "no overflow after very many failures"


@pytest.mark.parametrize("options", [{"first": 0}, {"first": 2, "cap": 1}, {"failures": -1}])
def test_a_backoff_that_cannot_work_is_refused(options):
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**options)
