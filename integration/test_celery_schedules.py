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
