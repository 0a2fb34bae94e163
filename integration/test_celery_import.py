"""Turning delay_broker on for a Celery app that already has ETA tasks waiting, on Redis and RabbitMQ.

A producer with kombu's plain transport fills the queue with countdown tasks (and a few ready ones), then:
``delay-broker import`` (a real subprocess) moves them after a dry run that changes nothing, leaving the rest of
the queue as it was; an import of more is killed with SIGKILL midway and run again; and a real ``celery worker``
with delay_broker, started last, receives more countdown tasks and parks them instead of holding them. Every task
runs once, at or after its due time. The threshold is 2 s; tasks are due 12 to 20 s after they are sent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from .celery_apps.app import make_app
from .celery_apps.brokers import env_for
from .celery_apps.harness import CeleryEnv, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["redis", "amqp"])
def env(request: pytest.FixtureRequest) -> Iterator[CeleryEnv]:
    celery_env = env_for(request.param, request, uuid.uuid4().hex[:10], options={"threshold": 2.0})
    try:
        yield celery_env
    finally:
        celery_env.close()


def plain_app(env: CeleryEnv) -> Celery:
    """The app as it was before delay_broker: kombu's own transport, same broker, queue and key prefix."""
    options = json.loads(env.env["DBT_OPTIONS"])
    options.pop("delay_broker", None)
    return make_app({**env.env, "DBT_TRANSPORT": "", "DBT_OPTIONS": json.dumps(options)})


def start_import(env: CeleryEnv, *args: str, slow: float | None = None) -> subprocess.Popen[str]:
    variables = {**os.environ, **env.env, "PYTHONPATH": str(ROOT)}
    if slow is not None:
        variables["DBT_SLOW_IMPORT"] = str(slow)
    command = [sys.executable, "-c", "from delay_broker.cli import main; main()", "import"]
    return subprocess.Popen(
        [*command, "--celery", "integration.celery_apps.app:app", *args],
        cwd=ROOT,
        env=variables,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_import(env: CeleryEnv, *args: str) -> dict[str, Any]:
    """``delay-broker import ... --json``: the report of the app's queue (its priority lists added up)."""
    process = start_import(env, *args, "--json")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, f"import failed ({process.returncode}):\n{out}\n{err}"
    reports = [queue for queue in json.loads(out)["queues"] if queue["queue"].split(" ")[0] == env.queue]
    total: dict[str, Any] = {"examined": 0, "moved": 0, "already_parked": 0, "left": {}}
    for report in reports:
        for key in ("examined", "moved", "already_parked"):
            total[key] += report[key]
        for reason, count in report["left"].items():
            total["left"][reason] = total["left"].get(reason, 0) + count
    return total


def queue_list(env: CeleryEnv) -> list[bytes]:
    prefix = json.loads(env.env["DBT_OPTIONS"]).get("global_keyprefix", "")
    return list(redis.Redis.from_url(env.env["DBT_BROKER_URL"]).lrange(f"{prefix}{env.queue}", 0, -1))


def held_by_workers(env: CeleryEnv, request: pytest.FixtureRequest) -> int:
    """Tasks delivered to a worker and not acknowledged: kombu's unacked hash on Redis, rabbitmqctl on RabbitMQ."""
    if env.kind == "redis":
        prefix = json.loads(env.env["DBT_OPTIONS"]).get("global_keyprefix", "")
        return int(redis.Redis.from_url(env.env["DBT_BROKER_URL"]).hlen(f"{prefix}unacked"))
    return request.getfixturevalue("rabbitmq").queue_counts().get(env.queue, (0, 0))[1]  # type: ignore[no-any-return]


def send(app: Celery, tag: str, due: dict[str, float], countdown: float | None = None) -> str:
    due_at = time.time() + (countdown or 0)
    result = app.tasks["dbtest.record"].apply_async((tag,), countdown=countdown)
    due[result.id] = due_at
    return str(result.id)


@pytest.mark.timeout(300)
def test_eta_tasks_sent_before_delay_broker_are_imported_or_parked_on_receipt_and_each_runs_once(
    env: CeleryEnv, request: pytest.FixtureRequest
) -> None:
    plain, store, due = plain_app(env), env.store, {}

    # 1. An import, after a dry run that changes nothing; the queue's other tasks stay as they were.
    imported = [send(plain, f"imp-{n}", due, countdown=20) for n in range(150)]
    for n in range(5):
        send(plain, f"ready-{n}", due)  # no eta
        send(plain, f"soon-{n}", due, countdown=1)  # due within the threshold
    before = queue_list(env) if env.kind == "redis" else []
    dry = run_import(env)
    assert (dry["examined"], dry["moved"]) == (160, 150)
    assert dry["left"] == {"due within the threshold": 5, "not delayed (no eta)": 5}
    assert store.stats().parked == 0 and env.queue_depth() == 160
    done = run_import(env, "--yes")
    assert (done["moved"], done["already_parked"]) == (150, 0)
    assert store.stats().parked == 150 and env.queue_depth() == 10
    if env.kind == "redis":
        moved = {entry for entry in before if json.loads(entry)["headers"]["id"] in set(imported)}
        assert queue_list(env) == [entry for entry in before if entry not in moved]  # untouched, in order
    for task_id in imported:
        info = store.get(task_id)
        assert info is not None and info.due_ms is not None and abs(info.due_ms / 1000 - due[task_id]) < 1.0

    # 2. An import killed midway (SIGKILL), then run again.
    killed = [send(plain, f"kill-{n}", due, countdown=20) for n in range(120)]
    process = start_import(env, "--yes", "--batch", "10", slow=0.3)
    try:
        wait_for(lambda: store.stats().parked >= 150 + 20, 60, what="the import parked some")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
    parked_before = sum(store.get(task_id) is not None for task_id in killed)
    assert 20 <= parked_before < 120, parked_before
    again = run_import(env, "--yes")
    print(f"\n{env.kind}: killed after {parked_before} parked; the rerun found {again['already_parked']} parked")
    assert again["moved"] + parked_before == 120 and store.stats().parked == 270 and env.queue_depth() == 10

    # 3. A worker with delay_broker receives plain countdown tasks: it parks them and holds none.
    received = [send(plain, f"recv-{n}", due, countdown=12) for n in range(40)]
    env.start_worker("w1")
    wait_for(lambda: all(store.get(task_id) for task_id in received), 60, what="the worker parked what it got")
    wait_for(lambda: env.queue_depth() == 0 and held_by_workers(env, request) == 0, 30, what="the worker holds none")

    # 4. Every task runs once, at or after its due time.
    wait_for(lambda: len(env.run_counts()) >= len(due), 90, what=f"all {len(due)} tasks ran")
    time.sleep(2.0)
    counts = env.run_counts()
    assert [task_id for task_id in due if counts[task_id] != 1] == []
    ran_at = {record["id"]: record["t"] for record in env.records()}
    assert [task_id for task_id in due if ran_at[task_id] < due[task_id] - 0.05] == []
    plain.close()
