"""The far tier (PostgreSQL) against Redis-only parking, on the same redis-server and client in one run.

- ``redis_bytes_per_far_message``: Redis memory per message parked beyond the horizon (it is a PostgreSQL row).
- ``tier_sweep_rate``: rows moved into Redis per second by one sweeper, against ``tier_raw_insert_rate``, the
  rate at which the same client parks the same messages straight into Redis (batches of the tier's size).
- ``tier_lateness_p99_ms``: promotion lateness of messages that were parked in PostgreSQL and swept in, beside
  the same load parked in Redis only.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import redis

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter
from delay_broker.deliverers import DirectLists
from delay_broker.far import FarTier

from .bench_core import MEMORY_PAYLOAD, settle
from .common import delete_store

HORIZON = 2.0


def _requests(count: int, delay: float, spread: float = 0.0) -> list[ParkRequest]:
    payload = b"p" * MEMORY_PAYLOAD
    return [
        ParkRequest(str(uuid.uuid4()), Envelope("default", payload, framework="dramatiq", name="send_email",
                                                hash_field=str(uuid.uuid4())), delay=delay + spread * n / max(1, count))
        for n in range(count)
    ]  # fmt: skip


def _store(client: redis.Redis, url: str | None, **tier: Any) -> DelayStore:
    far = None if url is None else FarTier(url, horizon=HORIZON, **{"sweep_interval": 0.2, **tier})
    return DelayStore(client, namespace=f"tier-{uuid.uuid4().hex[:6]}", far_tier=far)


def _drop(client: redis.Redis, store: DelayStore) -> None:
    delete_store(store)
    if store._tier.table is not None:
        with psycopg.connect(store._tier.table.url, autocommit=True) as connection:
            connection.execute(
                f"DELETE FROM {store._tier.table.table} WHERE namespace = %s", (store._tier.table.namespace,)
            )


def redis_bytes_per_far_message(client: redis.Redis, pg_url: str, count: int) -> float:
    store = _store(client, pg_url)
    store.stats()  # connect and create the table before measuring
    before = int(client.info("memory")["used_memory"])
    for start in range(0, count, 1000):
        store.park_many(_requests(min(1000, count - start), 30 * 86400))
    after = int(client.info("memory")["used_memory"])
    assert store.stats().far == count
    _drop(client, store)
    settle(client, before)
    return (after - before) / count


def sweep_rates(client: redis.Redis, pg_url: str, count: int, batch: int = 500) -> dict[str, float]:
    """Rows due just past the horizon, then swept in once within it, timed; and the same parks straight in Redis."""
    plain = _store(client, None)
    requests = _requests(count, 3600)
    began = time.perf_counter()
    for start in range(0, count, batch):
        plain.park_many(requests[start : start + batch])
    raw = count / (time.perf_counter() - began)
    _drop(client, plain)

    store = _store(client, pg_url, batch=batch)
    for start in range(0, count, 1000):
        store.park_many(_requests(min(1000, count - start), HORIZON + 0.5))
    time.sleep(1.0)  # all of them now within the horizon
    began = time.perf_counter()
    moved = 0
    while swept := store.sweep_far():
        moved += swept
    rate = moved / (time.perf_counter() - began)
    assert moved == count and store.stats().far == 0
    _drop(client, store)
    return {"tier_sweep_rate": rate, "tier_raw_insert_rate": raw}


def lateness(client: redis.Redis, pg_url: str, count: int, seconds: float = 4.0) -> dict[str, list[float]]:
    """``count`` messages due over ``seconds``: parked in PostgreSQL (beyond the horizon) and swept in, and the
    same parked in Redis only; one promoter each, run one after the other."""
    found: dict[str, list[float]] = {}
    for label, url in (("tiered", pg_url), ("redis_only", None)):
        store = _store(client, url)
        target = f"{store.keys.namespace}:ready"
        store.park_many(_requests(count, HORIZON + 1.0, seconds))
        if url is not None:
            assert store.stats().far == count
        promoter = Promoter(
            store, DirectLists({"default": ListTarget(target, mode="rpush")}), keep_lateness=True, max_idle=1.0
        ).start()
        deadline = time.monotonic() + HORIZON + seconds + 30
        while client.llen(target) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        promoter.stop()
        found[label] = [float(value) for value in promoter.counters.lateness_ms]
        client.delete(target)
        _drop(client, store)
    return found
