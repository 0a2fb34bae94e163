"""Celery adapter end to end: real ``celery worker`` processes on Redis, RabbitMQ and SQS (moto).

One worker per transport serves every test of this module (each test uses task ids of its own); the delay
threshold is 1 s, so a countdown of a few seconds is parked and anything under a second is not.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from delay_broker.celery import cancel, reschedule
from delay_broker.errors import PayloadTooLarge

from .celery_apps.brokers import env_for
from .celery_apps.harness import CeleryEnv, wait_for

KINDS = ["redis", "amqp", "sqs"]
PACK_AFTER = 10.0


@pytest.fixture(scope="module", params=KINDS)
def env(request: pytest.FixtureRequest) -> Iterator[CeleryEnv]:
    # Tasks 10 s or more ahead are packed (the month-long and minute-long ones below too).
    celery_env = env_for(request.param, request, uuid.uuid4().hex[:10], options={"pack_after": PACK_AFTER})
    try:
        celery_env.start_worker("w1")
        yield celery_env
    finally:
        celery_env.close()


def test_countdown_above_threshold_is_parked_and_runs_once_when_due(env: CeleryEnv) -> None:
    sent_at = time.time()
    # Long enough that the queue checks below (a new boto3 client each on SQS) finish before it is due.
    result = env.task("record").apply_async(("parked",), countdown=8)
    info = env.store.get(result.id)
    assert info is not None and info.state == "due"
    assert info.due_ms is not None and abs(info.due_ms / 1000 - (sent_at + 8)) < 1.5
    assert env.queue_depth() == 0, "a parked task must not be in the broker queue"
    time.sleep(1.5)
    assert env.queue_depth() == 0 and env.runs(result.id) == []
    wait_for(lambda: env.runs(result.id), 30, what="parked task ran")
    run = env.runs(result.id)[0]
    assert run["t"] >= info.due_ms / 1000 - 0.05, "ran before its due time"
    time.sleep(2)
    assert len(env.runs(result.id)) == 1


def test_a_packed_task_is_opened_in_time_and_runs_once_when_due(env: CeleryEnv) -> None:
    packed_before = env.store.stats().packed
    result = env.task("record").apply_async(("packed",), countdown=PACK_AFTER + 2)
    info = env.store.get(result.id)
    assert info is not None and info.state == "due" and info.due_ms is not None
    assert env.store.stats().packed == packed_before + 1 and env.queue_depth() == 0
    wait_for(lambda: env.runs(result.id), 40, what="packed task ran")
    assert env.runs(result.id)[0]["t"] >= info.due_ms / 1000 - 0.05, "ran before its due time"
    time.sleep(2)
    assert len(env.runs(result.id)) == 1 and env.store.stats().packed == packed_before


def test_thirty_day_countdown_parked_then_rescheduled_to_now_runs_once(env: CeleryEnv) -> None:
    countdown = 30 * 86400
    sent_at = time.time()
    result = env.task("record").apply_async(("month",), countdown=countdown)
    info = env.store.get(result.id)
    assert info is not None and info.state == "due" and info.due_ms is not None
    assert abs(info.due_ms / 1000 - (sent_at + countdown)) < 5
    assert reschedule(env.app, result.id, countdown=0) is not None
    wait_for(lambda: env.runs(result.id), 30, what="rescheduled task ran")
    time.sleep(1)
    assert len(env.runs(result.id)) == 1
    # amqp and SQS promotion acknowledges after the publish, so possibly after the task ran.
    wait_for(lambda: env.store.get(result.id) is None, 10, what="the promotion acknowledged")


def test_a_task_sqs_would_refuse_is_refused_when_sent_not_dead_lettered_when_due(env: CeleryEnv) -> None:
    if env.kind != "sqs":
        pytest.skip("SQS only: its 1 MiB limit applies to the message kombu will send, base64 and all")
    task_id = f"too-large-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PayloadTooLarge, match="over its limit of 1,048,576"):
        env.task("record").apply_async(("x" * 900_000,), countdown=8, task_id=task_id)
    assert env.store.get(task_id) is None


def test_countdown_below_threshold_uses_the_native_path(env: CeleryEnv) -> None:
    result = env.task("record").apply_async(("native",), countdown=0.5)
    assert env.store.get(result.id) is None
    wait_for(lambda: env.runs(result.id), 30, what="native task ran")
    assert len(env.runs(result.id)) == 1


def test_retry_with_countdown_above_threshold_is_parked_and_runs(env: CeleryEnv) -> None:
    result = env.task("retry_once").apply_async(("retry", 3))
    wait_for(lambda: env.runs(result.id), 30, what="first attempt")
    wait_for(lambda: (i := env.store.get(result.id)) is not None and i.state == "due", 10, what="retry parked")
    wait_for(lambda: len(env.runs(result.id)) >= 2, 30, what="retry ran")
    first, second = env.runs(result.id)[:2]
    assert (first["retries"], second["retries"]) == (0, 1)
    assert second["t"] - first["t"] >= 2.9
    time.sleep(1)
    assert len(env.runs(result.id)) == 2


def test_cancel_revoke_and_expiry_before_due_mean_never_run(env: CeleryEnv) -> None:
    record = env.task("record")
    cancelled = record.apply_async(("cancelled",), countdown=3)
    revoked = record.apply_async(("revoked",), countdown=3)
    expired = record.apply_async(("expired",), countdown=3, expires=1.5)
    control = record.apply_async(("control",), countdown=3)
    assert all(env.store.get(r.id) is not None for r in (cancelled, revoked, expired, control))
    assert cancel(env.app, cancelled.id) is True
    revoked.revoke()
    assert env.store.get(cancelled.id) is None
    assert env.store.get(revoked.id) is None, "revoke() must cancel the parked task"
    wait_for(lambda: env.runs(control.id), 30, what="control task ran")
    time.sleep(2)
    assert env.runs(cancelled.id) == [] and env.runs(revoked.id) == [] and env.runs(expired.id) == []


def test_a_task_id_published_twice_is_parked_once_and_a_warning_says_so(
    env: CeleryEnv, caplog: pytest.LogCaptureFixture
) -> None:
    task_id = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="delay_broker.celery"):
        env.task("record").apply_async(("monday",), countdown=60, task_id=task_id)
        assert "replaces" not in caplog.text
        env.task("record").apply_async(("tuesday",), countdown=60, task_id=task_id)
    assert f"task dbtest.record[{task_id}] replaces a task of the same id that was parked" in caplog.text
    info = env.store.get(task_id)
    assert info is not None and info.raw is not None and b"tuesday" in info.raw and b"monday" not in info.raw
    assert cancel(env.app, task_id)


def test_native_delayed_delivery_of_quorum_queues_is_left_to_rabbitmq(request: pytest.FixtureRequest) -> None:
    """Celery 5.5+ sends a countdown to a quorum queue through RabbitMQ's own delay exchanges, where no worker
    holds it; parking that publish delayed the task twice (a 30-day countdown ran after 60 days)."""
    pytest.importorskip("kombu.transport.native_delayed_delivery", reason="Celery < 5.5: no native delayed delivery")
    env = env_for("amqp", request, uuid.uuid4().hex[:10])
    env.env["DBT_QUORUM"] = "1"
    try:
        env.start_worker("w1")
        sent_at = time.time()
        result = env.task("record").apply_async(("quorum",), countdown=4)
        assert env.store.get(result.id) is None, "left to RabbitMQ's delay exchanges, not parked"
        wait_for(lambda: env.runs(result.id), 30, what="the task ran")
        ran_after = env.runs(result.id)[0]["t"] - sent_at
        assert 4 - 0.1 <= ran_after < 4 + 3, f"ran after {ran_after:.1f} s (twice delayed would be 8)"
        time.sleep(1)
        assert len(env.runs(result.id)) == 1
    finally:
        env.close()
