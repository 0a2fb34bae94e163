"""The Celery side of the chaos run: ``celery -A integration.chaos.celery_app worker`` with the lane in the
environment. Our Redis transport keeps the store in the broker's Redis (exactly-once hand-off); late acks and a
short visibility timeout let kombu give a SIGKILLed worker's tasks to another worker within the run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from celery import Celery

from .common import ENV_BATCH, ENV_BROKER_URL, ENV_LANE, ENV_LEASE, THRESHOLD_S, Recorder, namespace

VISIBILITY_TIMEOUT_S = 60
"""kombu's Redis default is an hour. Safe this short only because no worker holds a delayed task: they are parked."""


def make_app(env: Mapping[str, str]) -> Celery:
    app = Celery("chaos", broker=env[ENV_BROKER_URL])
    app.conf.broker_transport = "delay_broker.celery.transport:RedisTransport"
    app.conf.broker_transport_options = {
        "visibility_timeout": VISIBILITY_TIMEOUT_S,
        # kombu scans for such tasks every 10 x 10 s by default, under a mutex a killed worker may hold for 300 s.
        "unacked_restore_interval": 5,
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": 30,
        "delay_broker": {
            "threshold": THRESHOLD_S,
            "namespace": namespace(env),
            "batch": int(env[ENV_BATCH]),
            "lease": float(env[ENV_LEASE]),
            "max_idle": 1.0,
        },
    }
    app.conf.task_default_queue = namespace(env)
    app.conf.task_acks_late = True  # a task whose worker is killed runs again instead of never
    app.conf.worker_prefetch_multiplier = 4
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    record = Recorder(env)

    @app.task(name="chaos.run", shared=False)
    def chaos_run(id: str, due_ms: int) -> None:
        record(id, due_ms)

    return app


app = make_app(os.environ) if os.environ.get(ENV_LANE) else None
