"""The chaos run at CI scale (``python -m integration.chaos --scale ci``): four targets, real workers, 24 SIGKILLs,
a redis-server crash (AOF), a RabbitMQ restart and a Sentinel failover. The at-least-once targets (RabbitMQ, SQS)
run with effectively-once execution (OnceMiddleware): no duplicate from a promoter kill; only what the guarantee
runs twice, a copy of a delivery that ran while the store failed over (see integration/chaos/check.py). The full
run is the same code at ``--scale full``; its figures are in docs/reliability.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .chaos.check import STORE_CAUSES
from .chaos.run import LANES, SCALES, ChaosRun


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_run_at_ci_scale_loses_nothing_and_duplicates_only_within_the_guarantees(tmp_path: Path) -> None:
    report = ChaosRun("ci", logs=tmp_path).execute()
    print("\n" + "\n".join(report.lines()))
    scale = SCALES["ci"]
    assert report.events["kills"] == scale.kills
    assert report.events["redis_restarts"] == scale.redis_restarts
    assert report.events["rabbitmq_restarts"] == scale.rabbit_restarts
    assert report.events["failovers"] == scale.failovers
    assert [target["target"] for target in report.targets] == [lane.name for lane in LANES]
    assert report.events["messages"] == sum(target["messages"] for target in report.targets) == scale.messages
    for target in report.targets:
        assert target["ok"], target
        # Celery included: our Redis transport's reliable fetch closes the gap where kombu's own fetch lost a task.
        assert target["lost"] == 0, target["lost_where"]
        assert (target["early"], target["strangers"]) == (0, 0), target
        assert target["duplicated"] <= target["duplicate_bound"], target
        store = target["store"]
        # Every parked message left the store once, by promotion, and nothing was dead-lettered or left behind.
        assert store["counter_parked"] == store["counter_promoted"] == target["messages"], store
        assert (store["left_parked"], store["left_inflight"], store["left_dead"]) == (0, 0, 0), store
        if target["guarantee"] == "exactly-once":
            assert target["duplicated"] == 0, target  # nothing unexplained either
        if target["guarantee"] == "effectively-once":
            causes = {cause for cause in target["by_cause"] if cause in STORE_CAUSES}
            assert causes <= {"failover"}, target  # a promoter kill's copy is always dropped
    guarantees = {target["target"]: target["guarantee"] for target in report.targets}
    assert guarantees["dramatiq-rabbitmq"] == guarantees["dramatiq-sqs"] == "effectively-once"
