"""The Dramatiq app the benchmark's worker processes run (``dramatiq benchmarks.apps.dramatiq_app:broker``).

Environment:
  BENCH_REDIS_URL   the benchmark's redis-server (the RedisBroker, the delay store and the records)
  BENCH_NS          RedisBroker namespace (and delay store namespace)
  BENCH_MODE        "ours": DelayMiddleware (threshold 0, promoter thread in the worker, keeping lateness);
                    "native": plain RedisBroker, delays held by the worker as Dramatiq does
  BENCH_STOCK_PROMOTER  "1": mode "ours" with the middleware's own promoter thread (``promote_in_workers``),
                    which keeps no lateness figures (the e2e measure)
  BENCH_QUEUE       queue of the probe actor
  BENCH_RECORDS     list the probe RPUSHes "due_ms,started_ms" to
  BENCH_PROMOTER    list the promoter's lateness figures (JSON) are RPUSHed to when the worker stops
  BENCH_E2E_*       the e2e measure's recorder and its ``e2e_probe`` actor (see benchmarks/apps/recorder.py)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from benchmarks.apps.recorder import Recorder, from_env
from delay_broker.dramatiq import DelayMiddleware, build_promoter
from delay_broker.promoter import Promoter

ENV = os.environ


class PromoterProbe(dramatiq.Middleware):
    """Runs the promoter thread exactly as ``promote_in_workers=True`` does, but keeps its lateness figures."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        self.promoter: Promoter | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.promoter = build_promoter(broker, keep_lateness=True).start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self.promoter is not None:
            self.promoter.stop()
            redis.Redis.from_url(self.url).rpush(self.key, json.dumps(self.promoter.counters.lateness_ms))


def make_broker(env: Any = ENV) -> RedisBroker:
    broker = RedisBroker(url=env["BENCH_REDIS_URL"], namespace=env["BENCH_NS"])
    if env.get("BENCH_MODE") == "ours" and env.get("BENCH_STOCK_PROMOTER") == "1":
        broker.add_middleware(DelayMiddleware(threshold=0, namespace=env["BENCH_NS"], promote_in_workers=True))
    elif env.get("BENCH_MODE") == "ours":
        broker.add_middleware(DelayMiddleware(threshold=0, namespace=env["BENCH_NS"], promote_in_workers=False))
        broker.add_middleware(PromoterProbe(env["BENCH_REDIS_URL"], env.get("BENCH_PROMOTER", "bench:promoter")))
    return broker


def declare_probe(broker: dramatiq.Broker, queue: str) -> dramatiq.Actor[Any, Any]:
    """The probe actor: records when it starts. Producers declare it too (to send), with the same name."""
    records = redis.Redis.from_url(ENV["BENCH_REDIS_URL"]) if "BENCH_RECORDS" in ENV else None

    def probe(due_ms: float) -> None:
        started = time.time() * 1000.0
        if records is not None:
            records.rpush(ENV["BENCH_RECORDS"], f"{due_ms},{started}")

    return dramatiq.actor(broker=broker, queue_name=queue, actor_name="probe", max_retries=0)(probe)


def declare_e2e_probe(broker: dramatiq.Broker, queue: str, recorder: Recorder | None) -> dramatiq.Actor[Any, Any]:
    """The e2e measure's actor: hands message ``n``'s start to the batching recorder (producers pass None)."""

    def e2e_probe(n: int, due_ms: float) -> None:
        if recorder is not None:
            recorder.record(n, due_ms)

    return dramatiq.actor(broker=broker, queue_name=queue, actor_name="e2e_probe", max_retries=0)(e2e_probe)


if "BENCH_REDIS_URL" in ENV:
    broker = make_broker()
    declare_probe(broker, ENV.get("BENCH_QUEUE", "bench"))
    declare_e2e_probe(broker, ENV.get("BENCH_QUEUE", "bench"), from_env(ENV))
