"""Chaos and load on the store's own Redis: concurrent promoter processes, kill -9 of promoters, and a
redis-server killed and restarted under load with an fsync-always append-only file.

Every test prints its figures (delivered, lost, duplicated, kills, ...); ``pytest -s`` shows them.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from delay_broker import DelayBrokerError, DelayStore, Envelope, ParkRequest
from delay_broker.clock import due_of_score
from delay_broker.embedded import EmbeddedRedis
from tests.helpers import wait_for as shared_wait_for

ROOT = Path(__file__).resolve().parents[1]


wait_for = functools.partial(shared_wait_for, interval=0.05)


class Promoters:
    """Promoter processes (``tests.promoter_process``) that can be killed with SIGKILL and replaced."""

    def __init__(self, url: str, namespace: str, target: str, *options: str) -> None:
        self.command = [sys.executable, "-m", "tests.promoter_process", url, namespace, target, *options]
        self.alive: list[subprocess.Popen[str]] = []
        self.started = 0
        self.kills = 0

    def spawn(self) -> None:
        process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        # Recorded before the handshake, so stop() reaps it even if the handshake fails.
        self.alive.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        self.started += 1

    def kill_one(self, rng: random.Random) -> None:
        process = self.alive.pop(rng.randrange(len(self.alive)))
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        self.kills += 1

    def stop(self) -> None:
        for process in self.alive:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.alive:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
            if process.stdout is not None:
                process.stdout.close()
        self.alive = []


@pytest.fixture
def chaos(redis_server: EmbeddedRedis, unique: str) -> Iterator[tuple[redis.Redis, DelayStore, str]]:
    client = redis_server.client()
    store = DelayStore(client, namespace=f"chaos-{unique}")
    target = f"chaos-{unique}:ready"
    yield client, store, target
    client.delete(target, *client.scan_iter(match=store.keys.pattern))
    client.close()


def park_spread(store: DelayStore, count: int, seconds: float, prefix: str) -> list[str]:
    """``count`` messages whose payload is their id, due evenly over the next ``seconds``."""
    ids = [f"{prefix}-{n}" for n in range(count)]
    store.park_many(
        ParkRequest(id, Envelope(route="ready", payload=id.encode()), delay=seconds * n / count)
        for n, id in enumerate(ids)
    )
    return ids


def delivered(client: redis.Redis, target: str) -> Counter[str]:
    return Counter(item.decode() for item in client.lrange(target, 0, -1))


def figures(received: Counter[str], ids: list[str]) -> tuple[int, int, int]:
    """(delivered, lost, duplicated): duplicated counts extra copies beyond the first."""
    expected = set(ids)
    lost = len(expected - set(received))
    return sum(received.values()), lost, sum(received.values()) - len(set(received))


# -- 1. concurrent promoters ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_four_promoter_processes_deliver_100k_messages_exactly_once(redis_server, chaos):
    client, store, target = chaos
    promoters = Promoters(redis_server.url, store.keys.namespace, target, "--batch", "200")
    started = time.monotonic()
    try:
        for _ in range(4):
            promoters.spawn()
        ids = park_spread(store, 100_000, seconds=3.0, prefix="load")
        parked_in = time.monotonic() - started
        wait_for(lambda: client.llen(target) >= 100_000, 180, "100,000 messages delivered")
        time.sleep(0.5)  # anything extra (a duplicate) would show up now
    finally:
        promoters.stop()
    received = delivered(client, target)
    total, lost, duplicated = figures(received, ids)
    stats = store.stats()
    left = stats.parked + stats.inflight + stats.dead
    print(
        f"\n4 promoter processes, exactly-once path: parked 100000 in {parked_in:.1f} s, delivered {total}, "
        f"lost {lost}, duplicated {duplicated}, left behind {left}, wall {time.monotonic() - started:.1f} s"
    )
    assert (total, lost, duplicated, left) == (100_000, 0, 0, 0)
    assert set(received) == set(ids)
    assert stats.counters["promoted"] == 100_000


# -- 2. kill -9 of promoters ------------------------------------------------------------------------------------


def kill_and_replace(promoters: Promoters, kills: int, rng: random.Random, pause: tuple[float, float]) -> None:
    """SIGKILL a random promoter at random moments, starting a new process after each, ``kills`` times."""
    while promoters.kills < kills:
        time.sleep(rng.uniform(*pause))
        promoters.kill_one(rng)
        promoters.spawn()


@pytest.mark.slow
def test_kill_9_on_the_exactly_once_path_loses_and_duplicates_nothing(redis_server, chaos):
    client, store, target = chaos
    rng = random.Random()
    promoters = Promoters(redis_server.url, store.keys.namespace, target, "--batch", "50")
    started = time.monotonic()
    try:
        for _ in range(2):
            promoters.spawn()
        ids = park_spread(store, 20_000, seconds=12.0, prefix="x1")
        kill_and_replace(promoters, 20, rng, pause=(0.1, 0.6))
        killing_took = time.monotonic() - started
        wait_for(lambda: store.stats().parked == 0, 60, "everything promoted")
        wait_for(lambda: client.llen(target) >= len(ids), 30, "everything delivered")
        time.sleep(0.3)
    finally:
        promoters.stop()
    received = delivered(client, target)
    total, lost, duplicated = figures(received, ids)
    stats = store.stats()
    print(
        f"\nkill -9, exactly-once path: {promoters.kills} kills over {killing_took:.1f} s "
        f"({promoters.started} processes), delivered {total}, lost {lost}, duplicated {duplicated}, "
        f"dead {stats.dead}, left {stats.parked + stats.inflight}"
    )
    assert promoters.kills >= 20
    assert (lost, duplicated, total) == (0, 0, len(ids))
    assert (stats.parked, stats.inflight, stats.dead) == (0, 0, 0)


@pytest.mark.slow
def test_kill_9_on_the_at_least_once_path_loses_nothing_and_duplicates_at_most_a_batch_per_kill(redis_server, chaos):
    client, store, target = chaos
    rng = random.Random()
    batch = 20
    options = ("--lease-mode", "--deliver-sleep", "0.004", "--lease", "2", "--batch", str(batch))
    promoters = Promoters(redis_server.url, store.keys.namespace, target, *options)
    started = time.monotonic()
    try:
        for _ in range(2):
            promoters.spawn()
        # More than two promoters can deliver at 4 ms each: they work through full batches when killed.
        ids = park_spread(store, 6_000, seconds=12.0, prefix="x2")
        kill_and_replace(promoters, 20, rng, pause=(0.2, 0.7))
        killing_took = time.monotonic() - started
        stranded = store.stats().inflight
        # Leases of the killed promoters run out after 2 s; the survivors take those messages back.
        wait_for(lambda: set(ids) <= set(delivered(client, target)), 90, "every message delivered")
        wait_for(lambda: store.stats().inflight == 0, 30, "no lease left")
        time.sleep(0.3)
    finally:
        promoters.stop()
    received = delivered(client, target)
    total, lost, duplicated = figures(received, ids)
    stats = store.stats()
    most = max(received.values())
    print(
        f"\nkill -9, at-least-once (lease) path, batch {batch}: {promoters.kills} kills over {killing_took:.1f} s, "
        f"{stranded} in flight at the last kill, delivered {total}, lost {lost}, duplicated {duplicated} "
        f"(bound {promoters.kills * batch} = one batch per kill), most copies of one message {most}, "
        f"dead {stats.dead}"
    )
    assert promoters.kills >= 20
    assert lost == 0 and stats.dead == 0, "nothing lost, nothing dead-lettered"
    assert duplicated <= promoters.kills * batch, "at most one batch delivered again per kill"
    assert set(received) == set(ids), "every duplicate carries the id of a message that was parked"
    assert most <= 1 + promoters.kills
    assert (stats.parked, stats.inflight) == (0, 0)


# -- 3. redis-server killed and restarted, append-only file fsynced on every write ------------------------------


def test_every_acknowledged_park_survives_a_redis_kill_9_and_restart():
    """Parks that returned success are on disk before the reply (appendfsync always): SIGKILL loses none."""
    with EmbeddedRedis(["--appendonly", "yes", "--appendfsync", "always"]) as server:
        namespace = f"restart-{uuid.uuid4().hex[:8]}"
        acknowledged: dict[str, int] = {}
        unknown: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()

        def producer(worker: int) -> None:
            # Half the producers keep redis-py's default retries (a short outage is invisible to them), half
            # have none (they see StoreUnavailable, and the outcome of that park is unknown to them).
            retries = {} if worker % 2 else {"retry": Retry(NoBackoff(), 0)}
            client = server.client(socket_timeout=2, socket_connect_timeout=1, **retries)
            store = DelayStore(client, namespace=namespace)
            rng = random.Random(worker)
            n = 0
            while not stop.is_set():
                id = f"p{worker}-{n}"
                n += 1
                try:
                    result = store.park(id, Envelope(route="ready", payload=id.encode()), delay=rng.uniform(60, 3600))
                except DelayBrokerError:  # StoreUnavailable, or LOADING while the file is read back
                    with lock:
                        unknown.append(id)  # the outcome is unknown to the caller: it may or may not be stored
                    time.sleep(0.02)
                    continue
                with lock:
                    acknowledged[id] = result.due_ms
            client.close()

        threads = [threading.Thread(target=producer, args=(worker,), daemon=True) for worker in range(4)]
        for thread in threads:
            thread.start()
        restarts = 0
        try:
            for downtime in (0.0, 0.0, 2.5):
                time.sleep(0.8)
                # SIGKILL, then start again on the same port and directory.
                server.stop(kill=True)
                time.sleep(downtime)
                server.start()
                restarts += 1
            time.sleep(0.5)
        finally:
            stop.set()
            for thread in threads:
                thread.join(15)
        client = server.client()
        store = DelayStore(client, namespace=namespace)
        stored = {
            member.decode(): due_of_score(score)
            for member, score in client.zrange(store.keys.due, 0, -1, withscores=True)
        }
        payloads = {field.decode() for field in client.hkeys(store.keys.msg)}
        missing = [id for id in acknowledged if id not in stored or id not in payloads]
        wrong_due = [id for id, due in acknowledged.items() if id in stored and stored[id] != due]
        spot = random.sample(sorted(acknowledged), 50)
        for id in spot:
            info = store.get(id)
            assert info is not None and info.state == "due" and info.due_ms == acknowledged[id]
            assert info.envelope is not None and info.envelope.payload == id.encode()
        unknown_stored = sum(1 for id in unknown if id in stored)
    print(
        f"\nredis-server SIGKILLed and restarted {restarts} times under 4 parking threads (appendfsync always): "
        f"{len(acknowledged)} parks acknowledged, lost {len(missing)}, wrong due time {len(wrong_due)}; "
        f"{len(unknown)} failed with an error (outcome unknown to the caller), {unknown_stored} of them stored"
    )
    assert restarts == 3 and len(acknowledged) > 100
    assert missing == [] and wrong_due == []
    assert set(stored) <= set(acknowledged) | set(unknown), "nothing stored that nobody parked"
