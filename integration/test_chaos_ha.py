"""Chaos on the high-availability layouts (issue 10): real Redis Cluster and Sentinel servers, real faults.

- A sharded namespace on a 3-master Redis Cluster, served by promoter processes that are SIGKILLed and replaced:
  a shard whose promoter died is covered by the others within a lease, nothing is lost, and duplicates (the
  at-least-once path) are at most one batch per kill, each the id of a message that was in flight at a kill.
- A Sentinel set failed over twice while a producer parks and two exactly-once promoters promote, with durable
  writes (``replicas=1``): no acknowledged park is lost, everything is consumed, promotion resumes by itself, and
  the duplicates left are those of the documented window (docs/scaling.md, "What remains").

Every test prints its figures; ``pytest -s`` shows them.
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from redis.cluster import RedisCluster

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter
from delay_broker.connect import client_from_url
from delay_broker.deliverers import DirectLists
from delay_broker.errors import StoreError
from tests.helpers import threads_running
from tests.helpers import wait_for as shared_wait_for

from .test_chaos_redis import Promoters

if TYPE_CHECKING:
    from .ha_servers import RedisClusterServers, SentinelSet

ROOT = Path(__file__).resolve().parents[1]

wait_for = functools.partial(shared_wait_for, interval=0.05)

CLIENT = {"socket_timeout": 5.0}
"""Client options of every store and consumer here: no call may hang a thread past the test's deadlines."""


def text(value: object) -> str:
    """A member or list item as text (redis-py's types allow str; these clients return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def delete_namespace(cluster: RedisClusterServers, store: DelayStore, *extra: str) -> None:
    """Every key of every shard of ``store`` (stop markers and heartbeats of killed promoters too), on every node."""
    for node in range(len(cluster.ports)):
        client = cluster.nodes[node].client()
        try:
            for space in store.shards:
                keys = list(client.scan_iter(match=space.pattern))
                for key in keys:  # one by one: keys of different shards are in different slots
                    client.delete(key)
        finally:
            client.close()
    for key in extra:
        store.client.delete(key)


# -- 1. sharded store on a 3-master cluster, promoter processes killed ------------------------------------------


@pytest.mark.slow
def test_kill_9_of_promoters_over_a_sharded_cluster_store_loses_nothing(redis_cluster: RedisClusterServers) -> None:
    namespace = f"chaos-cl-{uuid.uuid4().hex[:10]}"
    store = DelayStore.from_url(redis_cluster.url, namespace=namespace, shards=6, **CLIENT)
    assert isinstance(store.client, RedisCluster)
    # The namespace's hash tag puts the target on shard 0's master; the at-least-once path does not need it there,
    # but it keeps every key of the test under the namespace's patterns.
    target = f"{{{namespace}}}:ready"
    count, spread, batch, lease, kills = 20_000, 10.0, 50, 2.0, 7
    rng = random.Random()
    options = ("--lease-mode", "--deliver-sleep", "0.001", "--lease", str(lease), "--batch", str(batch))
    promoters = Promoters(redis_cluster.url, namespace, target, *options)
    in_flight_at_kills: set[str] = set()
    stranded: list[int] = []
    started = time.monotonic()
    try:
        assert len(store.shards) == 6  # records the shard count before any promoter reads it
        for _ in range(3):
            promoters.spawn()
        ids = [f"c-{n}" for n in range(count)]
        store.park_many(
            ParkRequest(id, Envelope(route="ready", payload=id.encode()), delay=spread * n / count)
            for n, id in enumerate(ids)
        )
        while promoters.kills < kills:
            time.sleep(rng.uniform(1.2, 1.8))
            promoters.kill_one(rng)
            # Everything in flight now, the killed promoter's leases among them (they last `lease` s): the only
            # messages that may be delivered twice.
            held = [store.client.zrange(space.inflight, 0, -1) for space in store.shards]
            stranded.append(sum(len(members) for members in held))
            in_flight_at_kills.update(text(member) for members in held for member in members)
            promoters.spawn()
        killing_took = time.monotonic() - started

        def delivered() -> Counter[str]:
            return Counter(text(item) for item in store.client.lrange(target, 0, -1))

        wait_for(lambda: set(ids) <= set(delivered()), 90, "every message delivered")
        wait_for(lambda: store.stats().inflight == 0, 30, "no lease left on any shard")
        time.sleep(0.5)  # a duplicate pushed at the very end would show up now
        received = delivered()
        stats = store.stats()
        per_shard = [
            (
                store.client.zcard(space.due),
                store.client.zcard(space.inflight),
                store.client.hlen(space.leased),
                store.client.hlen(space.msg),
            )
            for space in store.shards
        ]
        shard_stats = [store.client.hgetall(space.stats) for space in store.shards]
    finally:
        promoters.stop()
        delete_namespace(redis_cluster, store, target)
        store.client.close()
    wall = time.monotonic() - started
    total = sum(received.values())
    lost = len(set(ids) - set(received))
    duplicates = {id: copies for id, copies in received.items() if copies > 1}
    duplicated = total - len(received)
    served = [int(reply.get(b"promoted", 0)) for reply in shard_stats]
    print(
        f"\nkill -9 over a 6-shard namespace on a 3-master cluster, at-least-once (lease {lease:.0f} s, batch {batch}):"
        f" {count} messages due over {spread:.0f} s, {promoters.kills} kills over {killing_took:.1f} s "
        f"({promoters.started} processes), in flight at each kill {stranded}, delivered {total}, lost {lost}, "
        f"duplicated {duplicated} (bound {promoters.kills * batch}: one batch per kill), "
        f"promoted per shard {served}, dead {stats.dead}, wall {wall:.1f} s"
    )
    assert promoters.kills >= 6
    assert lost == 0 and stats.dead == 0, "nothing lost, nothing dead-lettered"
    assert set(received) == set(ids), "every delivery is of a message that was parked"
    assert duplicated <= promoters.kills * batch, "at most one batch delivered again per kill"
    assert set(duplicates) <= in_flight_at_kills, "every duplicate was in flight when a promoter was killed"
    assert max(received.values()) <= 1 + promoters.kills
    assert per_shard == [(0, 0, 0, 0)] * 6, f"left on a shard (due, inflight, leased, msg): {per_shard}"
    assert all(n > 0 for n in served), "every shard was served"
    assert (stats.shards, stats.parked, stats.inflight) == (6, 0, 0)
    # Acknowledgements are counted once per message (an ack for a lease that ran out is refused), so the counters
    # add up to the messages, whatever the duplicates.
    assert stats.counters.get("parked") == count and stats.counters.get("promoted") == count, stats.counters
    assert stats.counters.get("dead_lettered", 0) == 0


# -- 2. Sentinel failovers under parking, exactly-once promotion with durable writes --------------------------


CONSUMER_RETRYABLE = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)
"""A BRPOP blocked on a master that is demoted is answered ``UNBLOCKED ...`` (a ResponseError); the next call goes
to the new master (redis-py's Sentinel pool reconnects on READONLY and on connection errors)."""


@pytest.mark.slow
def test_two_sentinel_failovers_lose_no_acknowledged_park_and_promotion_resumes(
    redis_sentinel: SentinelSet,
) -> None:
    namespace = f"chaos-st-{uuid.uuid4().hex[:10]}"
    target = f"{namespace}:ready"
    durable = {"namespace": namespace, "replicas": 1, "replica_timeout": 0.5, **CLIENT}
    store = DelayStore.from_url(redis_sentinel.url, **durable)
    batch, failovers = 20, 2
    routes = {"ready": ListTarget(target)}  # LPUSH: the consumer BRPOPs in due order
    # Each promoter has a store (a client) of its own, as separate processes would.
    promoters = [
        Promoter(DelayStore.from_url(redis_sentinel.url, **durable), DirectLists(routes), batch=batch, max_idle=1.0)
        for _ in range(2)
    ]
    attempts: Counter[str] = Counter()  # park attempts per id: > 1 means a park raised and was tried again
    acknowledged: dict[str, float] = {}  # id -> monotonic time its park returned
    consumed: list[tuple[float, str]] = []
    refused: Counter[str] = Counter()
    stop_producing, stop = threading.Event(), threading.Event()
    rng = random.Random()
    lock = threading.Lock()  # the producer adds to `acknowledged` while the test reads it

    def produce() -> None:
        n = 0
        while not stop_producing.is_set():
            id = f"s-{n}"
            while not stop_producing.is_set():  # the same id until it is acknowledged
                attempts[id] += 1
                try:
                    # Due after the run's longest refusal (a failover), so a park that raised but was written is
                    # replaced by the retry before anything could promote it.
                    store.park(id, Envelope(route="ready", payload=id.encode()), delay=rng.uniform(1.0, 2.5))
                except StoreError as error:
                    refused[type(error).__name__] += 1
                    time.sleep(0.05)
                    continue
                with lock:
                    acknowledged[id] = time.monotonic()
                break
            n += 1
            time.sleep(0.005)

    def consume() -> None:
        client = client_from_url(redis_sentinel.url, **CLIENT)
        try:
            while not stop.is_set():
                try:
                    popped = client.brpop([target], timeout=1)
                except CONSUMER_RETRYABLE as error:
                    refused[f"consumer {type(error).__name__}"] += 1
                    time.sleep(0.05)
                    continue
                if popped is not None:
                    consumed.append((time.monotonic(), text(popped[1])))
        finally:
            client.close()

    def consumed_after(moment: float) -> bool:
        """Something parked after ``moment`` was consumed: promotion works on the master of that time."""
        with lock:
            return any(acknowledged.get(id, 0.0) > moment for _, id in list(consumed))

    def all_consumed() -> bool:
        with lock:
            parked = set(acknowledged)
        return parked <= {id for _, id in list(consumed)}

    took: list[float] = []
    started = time.monotonic()
    try:
        for promoter in promoters:
            promoter.start()
        with threads_running({"producer": produce, "consumer": consume}, stop):
            wait_for(lambda: consumed_after(started), 30, "promotion under way before any failover")
            for _ in range(failovers):
                time.sleep(1.0)
                took.append(redis_sentinel.failover())
                healthy_at = time.monotonic()
                # Nobody restarts anything: the promoters and the consumer find the new master by themselves.
                wait_for(functools.partial(consumed_after, healthy_at), 30, "promotion resumed after the failover")
            time.sleep(1.0)
            stop_producing.set()
            wait_for(all_consumed, 30, "every acknowledged park consumed")
            wait_for(lambda: store.stats().parked == 0, 30, "nothing left parked")
            time.sleep(0.5)  # a duplicate pushed at the very end is consumed too
        master = redis_sentinel.master_client()
        left = (master.zcard(store.keys.due), master.hlen(store.keys.msg), master.llen(target))
        stats = store.stats()
        running = [promoter.running for promoter in promoters]
        errors = sum(promoter.counters.errors for promoter in promoters)
    finally:
        for promoter in promoters:
            promoter.stop(timeout=15.0)
        with contextlib.suppress(StoreError, redis.RedisError):
            master = redis_sentinel.master_client()
            master.delete(*store.keys.all(), target)
        for promoter in promoters:
            promoter.store.client.close()
        store.client.close()
    wall = time.monotonic() - started
    times = Counter(id for _, id in consumed)
    lost = sorted(set(acknowledged) - set(times))
    strangers = sorted(set(times) - set(attempts))
    duplicates = {id: copies for id, copies in times.items() if copies > 1}
    retried_parks = sorted(id for id in duplicates if attempts[id] > 1)
    print(
        f"\n{failovers} Sentinel failovers ({', '.join(f'{s:.1f} s' for s in took)}) under parking, 2 exactly-once "
        f"promoters (batch {batch}), replicas=1: {len(acknowledged)} parks acknowledged "
        f"({sum(attempts.values()) - len(attempts)} attempts refused and retried: {dict(refused)}), "
        f"{len(consumed)} consumed, lost {len(lost)}, duplicated {sum(duplicates.values()) - len(duplicates)} "
        f"{sorted(duplicates)} ({len(retried_parks)} of them after a retried park), promoter backoffs {errors}, "
        f"wall {wall:.1f} s"
    )
    assert lost == [], f"{len(lost)} acknowledged parks never consumed: {lost[:20]}"
    assert strangers == [], f"consumed but never parked: {strangers[:20]}"
    assert running == [True, True], "the promoters ran through both failovers without a restart"
    # The documented window: a promotion already running on the old master when Sentinel promoted the replica
    # (at most one batch per promoter and failover), consumed there before the old master was demoted.
    assert sum(duplicates.values()) - len(duplicates) <= failovers * len(promoters) * batch
    assert max(times.values()) <= 1 + failovers
    assert left == (0, 0, 0) and (stats.parked, stats.inflight, stats.dead) == (0, 0, 0), (left, stats)
