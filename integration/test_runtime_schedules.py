"""Schedules managed at runtime from the CLI, run by real Dramatiq workers and Celery workers: two worker
processes and two ``delay-broker promote`` processes (four promoters) share each schedule; every occurrence
and every run-now request runs once, pauses and removals hold, changes take effect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from delay_broker import RuntimeSchedules
from delay_broker.embedded import EmbeddedRedis
from delay_broker.schedule_defs import occurrence_id

from .celery_apps.brokers import env_for
from .celery_apps.harness import wait_for as celery_wait_for
from .test_dramatiq_brokers import ROOT, Deployment, running, start_promoter, stop_promoter, wait_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def deployment(redis_server: EmbeddedRedis) -> Iterator[Deployment]:
    unique = uuid.uuid4().hex[:10]
    env = {
        "DB_BROKER": "redis",
        "DB_REDIS_URL": redis_server.url,
        "DB_BROKER_NS": f"db{unique}",
        "DB_STORE_NS": f"runtime-{unique}",
        "DB_THRESHOLD": "1",
        "DB_RECORD_KEY": f"records:runtime:{unique}",
        "DB_QUEUES": f"rt_{unique}",
    }
    yield from running("redis", env, redis_server.url)


def cli(deployment: Deployment, *args: str) -> Any:
    """``delay-broker cron ... --json`` in a process of its own, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "delay_broker", "cron", *args, "--json"],
        cwd=ROOT,
        env={
            **os.environ,
            "DELAY_BROKER_REDIS_URL": deployment.env["DB_REDIS_URL"],
            "DELAY_BROKER_NAMESPACE": deployment.env["DB_STORE_NS"],
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_four_promoters_run_a_schedule_added_paused_run_now_changed_and_removed_from_the_cli(
    deployment: Deployment,
) -> None:
    namespace = deployment.env["DB_STORE_NS"]
    actor = f"record_{deployment.env['DB_QUEUES']}"
    runs = lambda token: deployment.runs(token)  # noqa: E731
    promoters = [start_promoter(deployment, deployment.env) for _ in range(2)]
    try:
        cli(deployment, "add", "rt", "--task", actor, "--every", "1s", "--args", '["every1"]')
        wait_for(lambda: len(runs("every1")) >= 4, 60, "four occurrences ran")

        paused = cli(deployment, "pause", "rt")
        assert paused["paused"] is True
        paused_at = time.time() * 1000
        time.sleep(0.5)  # an occurrence promoted as the pause was written may still run
        count = len(runs("every1"))
        requested = cli(deployment, "run-now", "rt")["id"]
        wait_for(lambda: any(run["id"] == requested for run in runs("every1")), 30, "the run-now request ran")
        time.sleep(2.0)
        assert len(runs("every1")) == count + 1, "only the run-now request ran while paused"

        resumed_at = time.time() * 1000  # before the call: the first occurrence may run before the CLI returns
        cli(deployment, "resume", "rt")
        wait_for(lambda: len(runs("every1")) >= count + 3, 60, "occurrences after the resume")

        cli(deployment, "change", "rt", "--every", "2s", "--args", '["every2"]')
        wait_for(lambda: len(runs("every2")) >= 3, 60, "occurrences of the changed schedule")

        assert cli(deployment, "remove", "rt", "--yes")["removed"] is True
        time.sleep(0.5)
        count = len(runs("every1")) + len(runs("every2"))
        time.sleep(3.0)
        assert len(runs("every1")) + len(runs("every2")) == count, "nothing runs once removed"
    except AssertionError as error:
        raise AssertionError(f"{error}\n{deployment.tail()}") from None
    finally:
        for process in promoters:
            stop_promoter(deployment, process)
    every1, every2 = runs("every1"), runs("every2")
    ids = [run["id"] for run in every1 + every2]
    assert len(ids) == len(set(ids)), f"an occurrence ran twice: {Counter(ids).most_common(2)}"
    regular = [run for run in every1 if run["id"] != requested]
    for run in regular:
        # The id of the second it ran in, or of the one before when it ran late: never early.
        due = run["t"] // 1000 * 1000
        assert run["id"] in {occurrence_id(namespace, "rt", due), occurrence_id(namespace, "rt", due - 1000)}
        assert not paused_at + 1500 < run["t"] < resumed_at, "nothing of the pause was made up"
    for run in every2:
        due = run["t"] // 2000 * 2000
        assert run["id"] in {occurrence_id(namespace, "rt", due), occurrence_id(namespace, "rt", due - 2000)}


def test_celery_workers_run_a_runtime_schedule_once_per_occurrence(request: pytest.FixtureRequest) -> None:
    env = env_for("redis", request, uuid.uuid4().hex[:10])
    schedules = RuntimeSchedules(env.store)
    try:
        env.start_worker("w1", concurrency=2)
        env.start_worker("w2", concurrency=2)
        schedules.add("rt", "dbtest.record", every=2, args=["runtime"])
        tagged = lambda: [record for record in env.records() if record["tag"] == "runtime"]  # noqa: E731
        celery_wait_for(lambda: len(tagged()) >= 3, 90, what="three occurrences ran")
        requested = schedules.run_now("rt")
        celery_wait_for(lambda: any(run["id"] == requested for run in tagged()), 60, what="the run-now request ran")
        schedules.remove("rt")
        for worker in env.workers:
            worker.stop()
        ids = [run["id"] for run in tagged()]
        assert len(ids) == len(set(ids)), f"an occurrence ran twice: {Counter(ids).most_common(2)}"
        namespace = env.store.keys.namespace
        for run in tagged():
            if run["id"] != requested:
                due = int(run["t"] * 1000) // 2000 * 2000
                assert run["id"] in {occurrence_id(namespace, "rt", due), occurrence_id(namespace, "rt", due - 2000)}
    finally:
        env.close()
