"""The Celery app the benchmark's workers run (``celery -A benchmarks.apps.celery_app worker``), and its producers.

Environment:
  BENCH_REDIS_URL   the benchmark's redis-server: broker (db 0), delay store, records
  BENCH_MODE        "ours": delay_broker's RedisTransport (threshold 0; the promoter thread keeps its lateness);
                    "native": plain Celery, ETA tasks held by the worker;
                    "lts": celery-longterm-scheduler (Task class, backend in BENCH_LTS_URL, a dedicated db)
  BENCH_NS          delay store namespace          BENCH_QUEUE    the probe task's queue
  BENCH_RECORDS     list the probe RPUSHes "due_ms,started_ms" to
  BENCH_PROMOTER    list the promoter's lateness figures (JSON) are RPUSHed to when the worker stops
  BENCH_LTS_URL     celery-longterm-scheduler's storage (redis://.../1)
  BENCH_RELIABLE_FETCH  "0": mode "ours" with kombu's own fetch (``reliable_fetch=False``); default "1"
  BENCH_STOCK_PROMOTER  "1": mode "ours" with the stock PromoterStep (no lateness figures kept; the e2e measure)
  BENCH_E2E_*       the e2e measure's recorder and its ``bench.e2e_probe`` task (see benchmarks/apps/recorder.py)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import redis
from celery import Celery, bootsteps

import delay_broker.celery
from benchmarks.apps.recorder import from_env
from delay_broker.promoter import Promoter


class ProbePromoterStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """delay_broker's worker promoter (as its PromoterStep runs it), keeping its lateness figures."""

    label = "bench promoter probe"
    name = "benchmarks.apps.celery_app.ProbePromoterStep"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.promoter: Promoter | None = None

    def start(self, parent: Any) -> None:
        self.promoter = delay_broker.celery.build_promoter(parent.app)
        self.promoter.counters.keep_lateness = True
        self.promoter.start()

    def stop(self, parent: Any) -> None:
        promoter, self.promoter = self.promoter, None
        if promoter is not None:
            promoter.stop()
            client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
            client.rpush(os.environ["BENCH_PROMOTER"], json.dumps(promoter.counters.lateness_ms))


def make_app(env: Mapping[str, str], worker: bool = False) -> Celery:
    """The app; ``worker``: the process the ``celery worker`` command runs (the e2e recorder is started there)."""
    mode = env["BENCH_MODE"]
    task_cls: Any = "celery.app.task:Task"
    if mode == "lts":
        import celery_longterm_scheduler

        task_cls = celery_longterm_scheduler.Task
    app = Celery("bench", broker=env["BENCH_REDIS_URL"], task_cls=task_cls)
    app.conf.task_default_queue = env["BENCH_QUEUE"]
    app.conf.broker_connection_retry_on_startup = True
    app.conf.worker_hijack_root_logger = False
    app.conf.task_ignore_result = True
    if mode == "ours":
        # Threshold 0: every task with an eta in the future is parked. The stock PromoterStep is turned off
        # (promoter=False) and ProbePromoterStep runs the same promoter, keeping its figures.
        reliable = env.get("BENCH_RELIABLE_FETCH", "1") == "1"
        stock = env.get("BENCH_STOCK_PROMOTER") == "1"
        delay_broker.celery.install(
            app, threshold=0, namespace=env["BENCH_NS"], promoter=stock, reliable_fetch=reliable
        )
        if not stock:
            app.steps["worker"].add(ProbePromoterStep)
    elif mode == "lts":
        app.conf.longterm_scheduler_backend = env["BENCH_LTS_URL"]
    records = redis.Redis.from_url(env["BENCH_REDIS_URL"])
    key = env.get("BENCH_RECORDS", "bench:records")

    @app.task(name="bench.probe", shared=False)
    def probe(due_ms: float) -> None:
        started = time.time() * 1000.0
        records.rpush(key, f"{due_ms},{started}")

    recorder = from_env(env) if worker else None

    @app.task(name="bench.e2e_probe", shared=False)
    def e2e_probe(n: int, due_ms: float) -> None:
        if recorder is not None:
            recorder.record(n, due_ms)

    return app


app = make_app(os.environ, worker=True) if "BENCH_MODE" in os.environ else None
