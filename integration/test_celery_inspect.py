"""Celery's own tools and parked tasks, with real ``celery worker`` processes: ``inspect scheduled`` (what Flower's
worker page calls) lists them once across workers, beside the ETA tasks workers hold; a revoke sent by an app
that has never heard of delay_broker (kombu's plain transport, in a process of its own) cancels them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from delay_broker.celery import reschedule
from delay_broker.clock import ms_to_datetime

from .celery_apps.brokers import env_for
from .celery_apps.harness import ROOT, CeleryEnv, wait_for

LIMIT = 3


def scheduled(env: CeleryEnv, **options: Any) -> dict[str, list[dict[str, Any]]]:
    """The replies of this env's workers to ``inspect scheduled`` (other tests' workers may share the broker)."""
    replies = env.app.control.inspect(timeout=3, **options).scheduled() or {}
    return {name: entries for name, entries in replies.items() if env.queue in name}


def test_inspect_scheduled_lists_parked_tasks_once_beside_the_workers_own(request: pytest.FixtureRequest) -> None:
    # Tasks due within 30 s are held by a worker (Celery's own scheduled entries); later ones are parked.
    env = env_for("redis", request, uuid.uuid4().hex[:10], options={"threshold": 30, "inspect_limit": LIMIT})
    try:
        workers = [f"w{n}-{env.queue}" for n in (1, 2)]
        for name in ("w1", "w2"):
            env.start_worker(name, concurrency=1)
        record = env.task("record")
        parked = [record.apply_async((f"parked-{n}",), countdown=3600 + 60 * n) for n in range(LIMIT + 1)]
        sent_at = time.time()
        held = record.apply_async(("held",), countdown=25)
        dues = {result.id: env.store.get(result.id) for result in parked}
        assert env.store.get(held.id) is None, "below the threshold: held by a worker, not parked"

        def held_by_a_worker() -> dict[str, list[dict[str, Any]]] | None:
            replies = scheduled(env)
            seen = [entry for entries in replies.values() for entry in entries if entry["request"]["id"] == held.id]
            return replies if seen and len(replies) == 2 else None

        replies = wait_for(held_by_a_worker, 20, what="both workers answer, one holding the ETA task")
        assert sorted(name.split("@")[0] for name in replies) == workers
        entries = [entry for reply in replies.values() for entry in reply]
        counts = Counter(entry["request"]["id"] for entry in entries)
        listed = [result.id for result in parked[:LIMIT]]
        assert all(counts[task_id] == 1 for task_id in [*listed, held.id]), counts
        assert counts[parked[LIMIT].id] == 0, "over the limit: counted in the note, not listed"
        answering = [name for name, reply in replies.items() if any(entry.get("parked") for entry in reply)]
        assert len(answering) == 1, "one worker answers with the parked tasks"
        by_id = {entry["request"]["id"]: entry for entry in entries}
        for task_id in listed:
            info = dues[task_id]
            assert info is not None and info.due_ms is not None
            entry = by_id[task_id]
            assert datetime.fromisoformat(entry["eta"]) == ms_to_datetime(info.due_ms)
            assert entry["request"]["name"] == "dbtest.record" and entry["request"]["args"][0].startswith("parked-")
        native = by_id[held.id]
        assert native["request"]["args"] == ["held"] and "parked" not in native, "Celery's own entry, as it was"
        assert abs(datetime.fromisoformat(native["eta"]).timestamp() - sent_at - 25) < 2
        notes = [entry for entry in entries if "more" in entry]
        assert [note["more"] for note in notes] == [1]

        # Flower's worker page asks one worker: that worker answers with the parked tasks.
        other = next(name for name in replies if name not in answering)
        alone = scheduled(env, destination=[other])
        assert [entry["request"]["id"] for entry in alone[other] if entry.get("parked")][:LIMIT] == listed
    finally:
        env.app.control.revoke(held.id)
        env.close()


@pytest.mark.parametrize("kind", ["redis", "amqp"])
def test_a_revoke_from_an_app_without_delay_broker_cancels_the_parked_task(
    request: pytest.FixtureRequest, kind: str
) -> None:
    env = env_for(kind, request, uuid.uuid4().hex[:10])
    try:
        worker = env.start_worker("w1", concurrency=1)
        record = env.task("record")
        revoked, control = (record.apply_async((tag,), countdown=30) for tag in ("revoked", "control"))
        assert env.store.get(revoked.id) is not None and env.store.get(control.id) is not None
        revoke_from_plain_app(env, revoked.id)
        wait_for(lambda: env.store.get(revoked.id) is None, 20, what="the worker cancelled the parked task")
        assert env.store.get(control.id) is not None, "cancelled long before it was due, not promoted"
        assert reschedule(env.app, revoked.id, countdown=0) is None
        assert reschedule(env.app, control.id, countdown=0) is not None
        wait_for(lambda: env.runs(control.id), 30, what="the control task ran")
        time.sleep(1)
        assert env.runs(revoked.id) == [] and env.queue_depth() == 0
        assert worker.text().count(f"revoke cancelled 1 parked task(s) of ['{revoked.id}']") == 1
    finally:
        env.close()


def revoke_from_plain_app(env: CeleryEnv, task_id: str) -> None:
    """``app.control.revoke`` in a process of its own, whose app uses kombu's plain transport for the same broker
    (and, on Redis, the same key prefix) and never imports delay_broker."""
    options = json.loads(env.env["DBT_OPTIONS"])
    options.pop("delay_broker")
    plain = {**env.env, "DBT_TRANSPORT": "", "DBT_OPTIONS": json.dumps(options)}
    script = (
        "import sys\n"
        "from integration.celery_apps.app import app\n"
        "with app.connection_for_write() as connection:\n"
        "    assert type(connection.transport).__module__.startswith('kombu.'), type(connection.transport)\n"
        "app.control.revoke(sys.argv[1])\n"
        "assert not [name for name in sys.modules if name.startswith('delay_broker')], 'delay_broker was imported'\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, task_id],
        cwd=ROOT,
        env={**os.environ, **plain, "PYTHONPATH": str(ROOT)},
        check=True,
        timeout=60,
    )
