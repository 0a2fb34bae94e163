"""The demo's Dramatiq app. The demo imports it to send, and runs it as ``dramatiq`` worker processes.

Environment (worker processes): DEMO_REDIS_URL, DEMO_NAMESPACE, DEMO_PARK ("1": with DelayMiddleware).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from ..dramatiq import DelayMiddleware

THRESHOLD_SECONDS = 1.0
"""Low, so that the demo's few-second delays are parked."""


def results_key(namespace: str) -> str:
    return f"{namespace}:demo:executed"


def boot_key(namespace: str) -> str:
    return f"{namespace}:demo:booted"


class BootSignal(dramatiq.Middleware):
    """Tells the demo when the worker is up, so memory is measured from a booted baseline."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client, self.namespace = client, namespace

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.client.set(boot_key(self.namespace), str(os.getpid()), ex=3600)


def build(url: str, namespace: str, *, park: bool) -> tuple[dramatiq.Broker, Any]:
    """A RedisBroker with (``park=True``) or without DelayMiddleware, and its one actor."""
    client = redis.Redis.from_url(url)
    broker = RedisBroker(url=url, namespace=namespace)  # type: ignore[no-untyped-call]
    broker.add_middleware(BootSignal(client, namespace))
    if park:
        broker.add_middleware(DelayMiddleware(threshold=THRESHOLD_SECONDS, namespace=namespace))

    def demo_task(n: int, due_ms: int) -> None:
        client.rpush(results_key(namespace), json.dumps([n, due_ms, time.time() * 1000]))

    actor = dramatiq.actor(broker=broker, actor_name="demo_task", max_retries=0)(demo_task)
    return broker, actor


if "DEMO_REDIS_URL" in os.environ:
    broker, _ = build(
        os.environ["DEMO_REDIS_URL"], os.environ["DEMO_NAMESPACE"], park=os.environ.get("DEMO_PARK") == "1"
    )
