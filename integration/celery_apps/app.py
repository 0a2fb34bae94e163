"""A Celery app for the integration tests, configured entirely from environment variables.

``celery -A integration.celery_apps.app worker`` reads ``os.environ``; tests build the same app in-process
with :func:`make_app` and a dict, to send tasks with exactly the worker's configuration.

- ``DBT_BROKER_URL``: the broker URL (redis://, amqp://, sqs://).
- ``DBT_TRANSPORT``: ``broker_transport`` (a delay_broker transport), or empty for plain Celery.
- ``DBT_OPTIONS``: JSON of ``broker_transport_options`` (including the ``delay_broker`` sub-dict).
- ``DBT_QUEUE``: the test's own default queue.
- ``DBT_RECORD_URL`` / ``DBT_RECORD_KEY``: where executions are recorded (RPUSH of a JSON line).
- ``DBT_SCHEDULE``: optional cron expression on which ``dbtest.record("cron")`` runs (schedule ``tick``).
- ``DBT_SLOW_IMPORT``: optional, seconds each batch ``delay-broker import`` parks waits before leaving the broker.
- ``DBT_QUORUM``: set, the queue is a RabbitMQ quorum queue on a topic exchange (Celery's native delayed
  delivery).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import redis
from celery import Celery
from kombu import Exchange, Queue


def make_app(env: Mapping[str, str]) -> Celery:
    app = Celery("dbtest", broker=env["DBT_BROKER_URL"])
    if env.get("DBT_TRANSPORT"):
        app.conf.broker_transport = env["DBT_TRANSPORT"]
    app.conf.broker_transport_options = json.loads(env.get("DBT_OPTIONS") or "{}")
    app.conf.task_default_queue = env["DBT_QUEUE"]
    if env.get("DBT_QUORUM"):
        queue = env["DBT_QUEUE"]
        arguments = {"x-queue-type": "quorum"}
        app.conf.task_queues = [
            Queue(queue, Exchange(queue, type="topic"), routing_key=queue, queue_arguments=arguments)
        ]
        app.conf.task_default_exchange_type = "topic"
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    app.conf.worker_prefetch_multiplier = 4
    recorder = redis.Redis.from_url(env["DBT_RECORD_URL"])
    record_key = env["DBT_RECORD_KEY"]

    def record(task: Any, tag: str) -> None:
        line = {"id": task.request.id, "tag": tag, "t": time.time(), "retries": task.request.retries}
        # Set by promoters with the once option (the header every delivery of one park carries).
        line["promotion"] = getattr(task.request, "delay_broker_promotion", None)
        recorder.rpush(record_key, json.dumps(line))

    @app.task(name="dbtest.record", bind=True, shared=False)
    def record_task(self: Any, tag: str) -> str:
        record(self, tag)
        return tag

    @app.task(name="dbtest.record_plain", shared=False)  # not bound: the request is read from the task object
    def record_plain(tag: str) -> str:
        record(record_plain, tag)
        return tag

    @app.task(name="dbtest.retry_once", bind=True, shared=False)
    def retry_once(self: Any, tag: str, countdown: float) -> str:
        record(self, tag)
        if self.request.retries == 0:
            raise self.retry(countdown=countdown)
        return tag

    if env.get("DBT_SCHEDULE"):
        from delay_broker.celery import schedule

        schedule(app, env["DBT_SCHEDULE"], record_task, args=("cron",), name="tick")
    return app


if os.environ.get("DBT_SLOW_IMPORT"):
    from integration.slow_import import install

    install(float(os.environ["DBT_SLOW_IMPORT"]))

app = make_app(os.environ) if "DBT_BROKER_URL" in os.environ else None
