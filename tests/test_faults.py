"""Faults: what a promoter says of a run of failures, and when the run ends (pure units, no Redis)."""

from __future__ import annotations

import logging

import pytest

from delay_broker.errors import ConfigurationError, DelayBrokerError, StoreUnavailable, TargetUnavailable
from delay_broker.faults import Faults


class Said:
    """The promoter's log lines at INFO and above, as "LEVEL message"."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG, logger="delay_broker.promoter")
        self.caplog = caplog

    @property
    def lines(self) -> list[str]:
        return [f"{r.levelname} {r.getMessage()}" for r in self.caplog.records if r.levelno >= logging.INFO]


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Said:
    return Said(caplog)


def test_an_outage_is_said_once_its_waits_grow_and_redis_answering_ends_it(said):
    faults = Faults("p1")
    waits = [faults.failed("sleeping", StoreUnavailable("connection refused")) for _ in range(6)]
    assert [stage for stage, _ in waits] == ["redis"] * 6
    for n, (_, wait) in enumerate(waits):
        assert 0.05 * 2**n <= wait <= 0.1 * 2**n
    assert said.lines == ["WARNING Promoter p1: Redis unavailable (connection refused); backing off."]
    faults.answered()
    faults.answered()
    assert said.lines[1:] == ["INFO Promoter p1: Redis reachable again."]
    # Redis answered, but the cycle failed after: the run goes on, and is not said again.
    assert 3.2 <= faults.failed("sleeping", DelayBrokerError("WRONGTYPE ..."))[1] <= 6.4 + 1e-9
    faults.recovered()
    assert len(said.lines) == 2, "nothing more: the outage's end was said"
    assert faults.backoff.failures == 0


def test_other_failures_end_with_promoting_again_and_are_said_once_per_run(said):
    faults = Faults("p1")
    assert faults.failed("promoting", TargetUnavailable("broker down"))[0] == "target"
    assert faults.failed("promoting", TargetUnavailable("broker down"))[0] == "target"
    faults.recovered()
    assert faults.failed("promoting", ConfigurationError("no route"))[0] == "configuration"
    assert faults.failed("promoting", ConfigurationError("no route"))[0] == "configuration"
    faults.recovered()
    faults.recovered()
    assert said.lines == [
        "WARNING Promoter p1: target broker unavailable (broker down); backing off.",
        "INFO Promoter p1: promoting again after 2 failed attempts.",
        "ERROR Promoter p1 cannot promote: no route",
        "INFO Promoter p1: promoting again after 2 failed attempts.",
    ]


def test_a_shard_backs_off_on_its_own(said):
    faults = Faults("p1")
    first, second = (faults.shard_failed(3, StoreUnavailable("master down")) for _ in range(2))
    assert 0.05 <= first <= 0.1 and 0.1 <= second <= 0.2
    faults.shard_answered(2)
    faults.shard_answered(3)
    faults.shard_answered(3)
    assert said.lines == [
        "WARNING Promoter p1: shard 3 unavailable (master down); promoting the other shards, retrying it with backoff.",
        "INFO Promoter p1: promoting shard 3 again.",
    ]
    assert faults.backoff.failures == 0, "the loop's own backoff is untouched"
