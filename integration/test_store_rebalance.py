"""A 4th master added to a real 3-master Redis Cluster (each master with a replica) and the slots rebalanced onto
it with ``redis-cli --cluster``, while 2 producers park and promoters promote (integration/rebalance_load.py):
nothing lost, nothing early, nothing promoted twice on the exactly-once path, duplicates within the at-least-once
bound, promotion goes on by itself, and what the CLI and the dashboard read is read all along."""

from __future__ import annotations

import logging

import pytest

from .cluster_moves import slot_owners
from .ha_servers import RedisClusterServers
from .rebalance_load import Plan, run

pytestmark = pytest.mark.slow


def test_a_rebalance_onto_a_new_master_under_load_loses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="delay_broker")
    with RedisClusterServers(3, replicas=1) as cluster:
        outcome = run(cluster, Plan(rate=40.0, warmup=4.0, after=4.0, pipeline=2, shards=12))
        owners = slot_owners(cluster)
    report = {key: value for key, value in vars(outcome).items() if key != "output"}
    print(report)  # shown with -s: the run's figures
    assert outcome.masters == 4 and len(owners) == 16384, report
    assert outcome.moved_shards >= 1 and outcome.exactly_once_moved, f"the rebalance moved shards in use: {report}"
    assert outcome.redirects["MOVED"] > 0, f"clients were sent to the new master: {report}"
    assert min(outcome.acknowledged.values()) > 100 and outcome.packed > 100, report
    assert outcome.lost == {"at_least_once": 0, "exactly_once": 0}, report
    assert outcome.early == 0 and outcome.min_lateness_ms >= 0, report
    assert outcome.duplicates["exactly_once"] == 0, report
    # At least once: a message runs again only when its claim's acknowledgement failed for the whole lease,
    # which fails the promoter's cycle (counted in its errors).
    assert outcome.duplicates["at_least_once"] <= outcome.duplicate_bound, report
    assert outcome.resumed, f"promotions after the rebalance, before the drain: {report}"
    assert outcome.reads > 0 and not outcome.read_errors, f"what the CLI and the dashboard read, all along: {report}"
    unexpected = [r.getMessage() for r in caplog.records if "unexpected" in r.getMessage().lower()]
    assert not unexpected, unexpected
