"""The reshard part of benchmarks/bench_scale.py: a namespace resharded from 3 to 12 shards under load with the
command SIGKILLed midway and run again (integration/reshard_load.py, on a bigger load than its test), and the rate
at which a reshard re-homes messages on a quiet server."""

from __future__ import annotations

import time
import uuid
from typing import Any

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.embedded import EmbeddedRedis
from integration.reshard_load import Plan, run

from .common import delete_store

PLAN = Plan(rate=150.0, warmup=5.0, after=5.0, settle=8.0, batch=500, backlog=40_000)


def reshard_under_load(plan: Plan = PLAN) -> dict[str, Any]:
    with EmbeddedRedis() as server:
        outcome = run(server.url, plan)
    return {key: value for key, value in vars(outcome).items() if key != "output"}


def reshard_rate(messages: int, payload: int, *, source: int = 3, target: int = 12) -> dict[str, Any]:
    """``messages`` parked in ``source`` shards (half due in 2 minutes, in the ordinary layout, half in a day,
    packed), then resharded to ``target`` with nothing else running: messages re-homed per second."""
    with EmbeddedRedis() as server:
        client = server.client(socket_timeout=60)
        store = DelayStore(client, namespace=f"rate-{uuid.uuid4().hex[:8]}", shards=source)
        body = b"p" * payload
        for start in range(0, messages, 1000):
            store.park_many(
                [ParkRequest(str(uuid.uuid4()), Envelope("ready", body), delay=120 if n % 2 else 86_400)
                 for n in range(start, min(messages, start + 1000))]
            )  # fmt: skip
        parked = store.stats().parked
        started = time.perf_counter()
        report = store.reshard(target, settle=0.0)
        wall = time.perf_counter() - started
        after = DelayStore(client, namespace=store.keys.namespace).stats()
        figures = {
            "messages": parked,
            "moved": report.moved,
            "seconds": report.seconds,
            "rate": report.rate,
            "wall": wall,
            "passes": report.passes,
            "parked_after": after.parked,
            "packed_after": after.packed,
            "shards_after": after.shards,
        }
        delete_store(DelayStore(client, namespace=store.keys.namespace))
        client.close()
    return figures
