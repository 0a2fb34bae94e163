"""Recurring Celery tasks without beat: two real worker processes, each promoter offering every occurrence."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import pytest

from delay_broker.cron import occurrence_id

from .celery_apps.brokers import env_for
from .celery_apps.harness import wait_for


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["redis", "amqp", "sqs"])
def test_two_workers_run_each_occurrence_of_a_schedule_once(request: pytest.FixtureRequest, kind: str) -> None:
    env = env_for(kind, request, uuid.uuid4().hex[:10])
    env.env["DBT_SCHEDULE"] = "* * * * * */2"
    namespace = env.store.keys.namespace
    try:
        started = time.time()
        env.start_worker("w1", concurrency=2)
        env.start_worker("w2", concurrency=2)
        cron_runs = lambda: [record for record in env.records() if record["tag"] == "cron"]  # noqa: E731
        wait_for(lambda: len(cron_runs()) >= 4, 90, what="four occurrences ran")
        for worker in env.workers:
            worker.stop()
        runs = cron_runs()
        ids = [run["id"] for run in runs]
        print(f"\n{kind}: {len(runs)} occurrences ran, most runs of one: {Counter(ids).most_common(1)[0][1]}")
        assert len(ids) == len(set(ids)), f"an occurrence ran twice: {Counter(ids).most_common(2)}"
        for run in runs:
            # The id is that of the even second it ran in (or of the one before, when it ran late): never early.
            due_ms = int(run["t"] * 1000) // 2000 * 2000
            assert run["id"] in {occurrence_id(namespace, "tick", due) for due in (due_ms, due_ms - 2000)}
            assert run["t"] >= started
        latest = env.store.schedules()["tick"]
        assert latest is not None and latest / 1000 > max(run["t"] for run in runs), "the next one waits parked"
    finally:
        env.close()


@pytest.mark.timeout(300)
def test_a_schedule_for_a_quorum_queue_runs_each_occurrence_once(request: pytest.FixtureRequest) -> None:
    """Celery sends an eta for a quorum queue through RabbitMQ's delay exchanges: an occurrence built that way
    was published at once instead of parked, and published again at every retry of its build."""
    pytest.importorskip("kombu.transport.native_delayed_delivery", reason="Celery < 5.5: no native delayed delivery")
    env = env_for("amqp", request, uuid.uuid4().hex[:10])
    env.env["DBT_QUORUM"] = "1"
    env.env["DBT_SCHEDULE"] = "* * * * * */15"  # longer than the 5 s between two tries of a failed build
    try:
        started = time.time()
        env.start_worker("w1", concurrency=2)
        cron_runs = lambda: [record for record in env.records() if record["tag"] == "cron"]  # noqa: E731
        wait_for(lambda: len(cron_runs()) >= 2, 90, what="two occurrences ran")
        time.sleep(6)  # a copy sent again at a retry of the build (every 5 s) would run by now
        env.workers[0].stop()
        ids = [run["id"] for run in cron_runs()]
        assert len(ids) == len(set(ids)), f"an occurrence ran twice: {Counter(ids).most_common(2)}"
        assert all(run["t"] >= started and run["t"] - run_due(run) < 5 for run in cron_runs())
    finally:
        env.close()


def run_due(run: dict[str, float]) -> float:
    """The due time of a ``* * * * * */15`` occurrence that ran at ``run["t"]`` (never early)."""
    return int(run["t"]) // 15 * 15
