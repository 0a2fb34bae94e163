"""A namespace resharded from 3 to 12 shards on a real Redis server while 2 producers park and 2 exactly-once
promoters promote, ``delay-broker reshard`` SIGKILLed midway and run again (integration/reshard_load.py): nothing
lost, nothing promoted twice, nothing early, a parked message found by id all along, and the namespace on 12 shards
at the end; and the same on a Redis Cluster, promoting at least once."""

from __future__ import annotations

import pytest

from delay_broker.embedded import EmbeddedRedis

from .ha_servers import RedisClusterServers
from .reshard_load import Plan, run


def test_a_reshard_killed_midway_and_run_again_under_load_loses_and_repeats_nothing(
    redis_server: EmbeddedRedis,
) -> None:
    outcome = run(redis_server.url, Plan(rate=40.0, warmup=3.0, after=3.0, settle=3.0, backlog=10_000))
    report = {key: value for key, value in vars(outcome).items() if key != "output"}
    print(report)  # shown with -s: the run's figures
    assert outcome.killed_midway, f"the first run was killed with messages left to move: {report}"
    assert 0 < outcome.moved_before_kill < outcome.moved, report
    assert outcome.acknowledged > 200 and outcome.rerun["done"], report
    assert outcome.lost == 0 and outcome.duplicated == 0 and outcome.early == 0, report
    assert outcome.reads > 50 and outcome.read_misses == 0, f"found by id in either layout: {report}"
    assert outcome.shards_after == 12 and '"generation":1' in outcome.layout_after, report
    # 11 of 12 messages change home (shard 0 is in both layouts and keeps a quarter of its third).
    assert outcome.moved >= 0.85 * outcome.backlog // 2, report


@pytest.mark.slow
def test_a_reshard_on_a_redis_cluster_killed_midway_loses_nothing(redis_cluster: RedisClusterServers) -> None:
    """The same on a 3-master Redis Cluster, where the shards of both layouts are spread over the masters and
    promotion is at least once (``check_direct`` refuses exactly-once promotion of a sharded namespace there)."""
    plan = Plan(rate=40.0, warmup=3.0, after=3.0, settle=3.0, backlog=6_000, exactly_once=False)
    outcome = run(redis_cluster.url, plan)
    report = {key: value for key, value in vars(outcome).items() if key != "output"}
    print(report)
    assert outcome.killed_midway and outcome.rerun["done"], report
    assert outcome.lost == 0 and outcome.early == 0, report
    assert outcome.duplicated <= outcome.duplicate_bound, report
    assert outcome.reads > 50 and outcome.read_misses == 0, report
    assert outcome.shards_after == 12, report
