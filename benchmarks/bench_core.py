"""Core benchmarks: the store and promoter against bare Redis doing the same work, in the same run.

    python benchmarks/bench_core.py [--messages N] [--batch B]

Starts a private redis-server, measures, and prints a table followed by ``name=value`` lines:

- drain_ratio: messages/s drained by a promoter through the exactly-once list path, over a bare Lua
  ZSET-to-list move of the same messages with the same batch size (target >= 0.7).
- park_many_ratio: messages/s of DelayStore.park_many over a raw pipelined ZADD+HSET (target >= 0.5).
- bytes_per_parked: Redis memory per parked message beyond its 250-byte payload (Dramatiq-shaped records).
- idle_calls_per_s: Redis round trips per second of one idle promoter (target <= 1).
- pack_open_block_ms: the longest another client's PING waited while a promoter opened packs of 1 MiB payloads
  (target < 50; each call of open_pack.lua copies at most PACK_OPEN_BYTES, 100 such records took 2.1 s before).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import delete_store
from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter
from delay_broker.deliverers import DirectLists
from delay_broker.embedded import EmbeddedRedis

PAYLOAD = b"x" * 100
HERE = Path(__file__).resolve().parent


def message_ids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


def park_due_now(store: DelayStore, ids: list[str]) -> float:
    envelope = Envelope(route="ready", payload=PAYLOAD)
    started = time.perf_counter()
    store.park_many([ParkRequest(id, envelope, delay=0) for id in ids])
    return time.perf_counter() - started


def raw_park(client: redis.Redis, prefix: str, ids: list[str]) -> float:
    """What parking costs with no checks, no envelope and no script: pipelined ZADD + HSET per message."""
    started = time.perf_counter()
    score = int(time.time() * 1000) * 1024
    for start in range(0, len(ids), 1000):
        pipe = client.pipeline(transaction=False)
        for id in ids[start : start + 1000]:
            pipe.zadd(f"{prefix}:due", {id: score})
            pipe.hset(f"{prefix}:msg", id, PAYLOAD)
        pipe.execute()
    return time.perf_counter() - started


def drain_with_promoter(store: DelayStore, target: str, batch: int, count: int) -> float:
    promoter = Promoter(store, DirectLists({"ready": ListTarget(target)}), batch=batch)
    started = time.perf_counter()
    while promoter.counters.promoted < count:
        promoter.step()
    return time.perf_counter() - started


def drain_bare(client: redis.Redis, prefix: str, target: str, batch: int) -> float:
    move = client.register_script((HERE / "bare_move.lua").read_text())
    keys = [f"{prefix}:due", f"{prefix}:msg", target]
    started = time.perf_counter()
    while move(keys=keys, args=[batch]):
        pass
    return time.perf_counter() - started


MEMORY_PAYLOAD = 250
"""Payload size of the memory measures (the issue's reference point)."""


def bytes_per_parked(
    client: redis.Redis, count: int, record_version: int = 2, pack_after: float | None = 300.0
) -> float:
    """Redis memory per parked message beyond its payload: ``count`` Dramatiq-shaped messages (uuid ids, actor
    name, a uuid hash field, 250-byte payloads) parked an hour ahead, in records of ``record_version``; packed
    (the default) or, with ``pack_after=None``, in the ordinary layout."""
    store = DelayStore(
        client, namespace=f"mem-{uuid.uuid4().hex[:6]}", record_version=record_version, pack_after=pack_after
    )
    payload = b"p" * MEMORY_PAYLOAD
    before = int(client.info("memory")["used_memory"])
    for start in range(0, count, 10_000):
        store.park_many([
            ParkRequest(str(uuid.uuid4()), Envelope(route="default", payload=payload, framework="dramatiq",
                                                    name="send_email", hash_field=str(uuid.uuid4())), delay=3600)
            for _ in range(min(10_000, count - start))
        ])  # fmt: skip
    after = int(client.info("memory")["used_memory"])
    delete_store(store)
    settle(client, before)
    return (after - before) / count - MEMORY_PAYLOAD


def settle(client: redis.Redis, level: int, timeout: float = 60.0) -> None:
    """Wait until Redis has given back the memory of deleted keys (it may free large ones in the background),
    so that the next measure starts from ``level``."""
    deadline = time.monotonic() + timeout
    while int(client.info("memory")["used_memory"]) > level + 2**20 and time.monotonic() < deadline:
        time.sleep(0.2)


def bytes_per_parked_floor(client: redis.Redis, count: int) -> float:
    """The same measure for the least a ZSET + HASH model can store: a bare ZADD + HSET of 36-character ids
    and the same payloads, with no envelope (the floor ``bytes_per_parked`` is compared with)."""
    prefix = f"floor-{uuid.uuid4().hex[:6]}"
    payload = b"p" * MEMORY_PAYLOAD
    score = int(time.time() * 1000 + 3_600_000) * 1024
    before = int(client.info("memory")["used_memory"])
    for start in range(0, count, 1000):
        pipe = client.pipeline(transaction=False)
        chunk = message_ids(min(1000, count - start))
        pipe.zadd(f"{prefix}:due", dict.fromkeys(chunk, score))
        pipe.hset(f"{prefix}:msg", mapping=dict.fromkeys(chunk, payload))
        pipe.execute()
    after = int(client.info("memory")["used_memory"])
    client.delete(f"{prefix}:due", f"{prefix}:msg")
    settle(client, before)
    return (after - before) / count - MEMORY_PAYLOAD


def client_round_trips(client: redis.Redis) -> int:
    """Client round trips a promoter makes: EVALSHA/EVAL (one per script) and BLPOP (sleeping). Commands run
    inside scripts are counted by Redis too, under their own names, and are left out here."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval", "blpop"))


def idle_calls_per_second(client: redis.Redis, seconds: float) -> float:
    store = DelayStore(client, namespace=f"idle-{uuid.uuid4().hex[:6]}")
    store.park("far-future", Envelope(route="ready", payload=PAYLOAD), delay=86400)
    promoter = Promoter(store, DirectLists({"ready": ListTarget("idle:ready")})).start()
    time.sleep(0.5)
    before = client_round_trips(client)
    time.sleep(seconds)
    after = client_round_trips(client)
    promoter.stop()
    delete_store(store)
    return (after - before) / seconds


def pack_open_block_ms(server: EmbeddedRedis, count: int = 40) -> float:
    """The longest wait of another client's PING while a promoter opens ``count`` packed 1 MiB payloads."""
    client = server.client()
    store = DelayStore(client, namespace=f"open-{uuid.uuid4().hex[:6]}", max_payload_bytes=2 * 1024 * 1024)
    payload = b"p" * 1024 * 1024
    for _ in range(count):
        store.park(str(uuid.uuid4()), Envelope(route="ready", payload=payload), delay=3600)
    opener = DelayStore(client, namespace=store.keys.namespace, pack_after=10 * 365 * 86400)  # opens them now
    pinger, waits, done = server.client(), [0.0], threading.Event()

    def ping() -> None:
        while not done.is_set():
            started = time.perf_counter()
            pinger.ping()
            waits.append(time.perf_counter() - started)

    thread = threading.Thread(target=ping)
    thread.start()
    try:
        while opener.open_packs(0, calls=100) is not None:
            pass
    finally:
        done.set()
        thread.join()
        pinger.close()
    delete_store(store)
    return max(waits) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="repeat each pair; the best round counts")
    options = parser.parse_args()
    n, batch = options.messages, options.batch

    with EmbeddedRedis() as server:
        client = server.client()
        drain_ours, drain_ref, park_ours, park_ref = [], [], [], []
        for _ in range(options.rounds):
            # Interleave ours and the reference so machine noise hits both alike.
            ids = message_ids(n)
            store = DelayStore(client, namespace=f"bench-{uuid.uuid4().hex[:6]}")
            park_ours.append(n / park_due_now(store, ids))
            prefix = f"bare-{uuid.uuid4().hex[:6]}"
            park_ref.append(n / raw_park(client, prefix, ids))
            drain_ours.append(n / drain_with_promoter(store, f"{prefix}:ours", batch, n))
            drain_ref.append(n / drain_bare(client, prefix, f"{prefix}:bare", batch))
            client.delete(f"{prefix}:ours", f"{prefix}:bare")
            delete_store(store)
        memory = bytes_per_parked(client, min(n, 100_000))
        idle = idle_calls_per_second(client, 10.0)
        open_block = pack_open_block_ms(server)

    results = {
        "drain_msgs_per_s": max(drain_ours),
        "drain_bare_msgs_per_s": max(drain_ref),
        "drain_ratio": max(drain_ours) / max(drain_ref),
        "park_many_msgs_per_s": max(park_ours),
        "park_raw_msgs_per_s": max(park_ref),
        "park_many_ratio": max(park_ours) / max(park_ref),
        "bytes_per_parked": memory,
        "idle_calls_per_s": idle,
        "pack_open_block_ms": open_block,
    }
    print(f"\ncore benchmark: {n} messages, batch {batch}, best of {options.rounds} rounds, payload {len(PAYLOAD)} B")
    print(f"{'measure':<24}{'value':>14}")
    for name, value in results.items():
        print(f"{name:<24}{value:>14.2f}")
    print()
    for name, value in results.items():
        print(f"{name}={value:.3f}")


if __name__ == "__main__":
    main()
