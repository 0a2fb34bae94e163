"""Scale-out and failover benchmark: a sharded namespace on a 3-master Redis Cluster, and Sentinel failovers
under load.

    python benchmarks/bench_scale.py [--only cluster,capacity,failover,rebalance] [--verbose]

Starts its own servers (integration/ha_servers.py: a 3-master Redis Cluster, a fresh Sentinel set of 1 master,
1 replica and 1 Sentinel per failover scenario, and an EmbeddedRedis), stops them at the end, and prints
``name=value`` lines, each group after a line or two saying what was measured:

- cluster_server_share_min/max: each master's share of the namespace's server time (``usec`` of EVALSHA/EVAL
  in ``INFO commandstats``) under a park + at-least-once promotion workload, shards=12 (target 0.23-0.43).
- cluster_capacity_ratio: the largest per-master ``used_memory`` growth on the cluster over the growth on one
  server, for the same parked messages (expected about 1/3).
- failover_lost_default / failover_lost_durable: acknowledged parks missing from the new master after a
  Sentinel failover under a 250/s producer, with replicas=0 / replicas=1 (target 0 for durable).
- failover_dup_exactly_once[_durable], failover_lost_exactly_once[_durable]: messages consumed twice / never,
  exactly-once promotion (DirectLists) with a failover mid-run.
- failover_s, failover_recovery_s[_durable]: how long the failover took; from SENTINEL FAILOVER to the end of
  the longest pause in consumption that overlaps it (target <= failover_s + 2).
- rebalance_lost, rebalance_max_pause_s: a 4th master added to a 3-master cluster (each with a replica) and
  ``redis-cli --cluster rebalance`` run while 2 producers park and 4 promoters promote
  (integration/rebalance_load.py): acknowledged parks never consumed (target 0), and the longest gap between two
  promotions that overlaps the rebalance; with the duplicates, early promotions and the time ``MIGRATE`` of one
  big pack blocks its master (migrate_pack_*).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import logging
import math
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # python benchmarks/bench_scale.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"

import redis

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter
from delay_broker.connect import client_from_url
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.embedded import EmbeddedRedis
from delay_broker.errors import StoreError
from integration.ha_servers import RedisClusterServers, SentinelSet
from tests.helpers import threads_running

from .bench_core import message_ids
from .common import delete_store, fmt, median
from .rebalance import PLAN, rebalance_under_load

SECTIONS = ("cluster", "capacity", "failover", "rebalance")
SHARDS = 12
FAR = 30 * 86400.0
"""Seconds: a delay that never comes due during the run."""
RETRYABLE = (StoreError, redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError)
"""What a producer or consumer waits out during a failover (50 ms, then the same call again)."""
CONSUMER_RETRYABLE = (*RETRYABLE, redis.ResponseError)
"""A BRPOP blocked on a master that is demoted is answered ``UNBLOCKED ...`` (a ResponseError)."""
CLIENT = {"socket_timeout": 5.0}
"""Client options of every store here: no call may hang a thread past the run's deadlines."""


def out(name: str, value: float | int) -> None:
    print(f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}", flush=True)


def say(text: str) -> None:
    print(f"# {text}", flush=True)


def namespace(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def running(targets: dict[str, Callable[[], None]], stop: threading.Event, timeout: float = 20.0) -> Any:
    """The tests' threads_running, warning (not failing) about threads left running."""
    return threads_running(targets, stop, timeout, lambda alive: say(f"WARNING: threads still running: {alive}"))


@contextlib.contextmanager
def promoters(make: Callable[[], Promoter], count: int) -> Iterator[list[Promoter]]:
    started: list[Promoter] = []
    try:
        for _ in range(count):
            started.append(make().start())
        yield started
    finally:
        for promoter in started:
            promoter.stop(timeout=15.0)
        for promoter in started:
            with contextlib.suppress(Exception):
                promoter.store.client.close()


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


# ------------------------------------------------------------------------------------------------- cluster


def script_usec(client: redis.Redis) -> int:
    """Server time (µs) spent in scripts: every store operation is one, commands inside them included."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in ("evalsha", "eval"))


def cluster_shares(cluster: RedisClusterServers, messages: int, seconds: float, chunk: int) -> dict[str, Any]:
    """Park ``messages`` over ``seconds`` from 2 producer threads while 2 at-least-once promoters move them into
    a list; each master's share of the script time spent on the namespace."""
    name = namespace("share")
    store = DelayStore.from_url(cluster.url, namespace=name, shards=SHARDS, **CLIENT)
    store.shard_for("")  # reads (records) the layout now, before the statistics are reset
    masters = [cluster.node_client(index) for index in range(cluster.masters)]
    target = f"{name}:ready"
    deliver_client = cluster.client(**CLIENT)
    ids = message_ids(messages)
    chunks = [ids[start : start + chunk] for start in range(0, messages, chunk)]
    interval = seconds / len(chunks)
    stop = threading.Event()
    failures: list[str] = []
    for master in masters:
        master.config_resetstat()
    started = time.monotonic()

    def produce(mine: list[int]) -> None:
        for index in mine:
            if stop.wait(max(0.0, started + index * interval - time.monotonic())):
                return
            # Due 0.5-1.5 s after it is parked: the whole set comes due over ~seconds.
            requests = [
                ParkRequest(id, Envelope("ready", id.encode()), delay=0.5 + (n % 100) / 100)
                for n, id in enumerate(chunks[index])
            ]
            try:
                store.park_many(requests)
            except Exception as error:  # reported, not retried: this part runs with no fault injected
                failures.append(f"{type(error).__name__}: {error}")

    producers = {f"producer-{n}": functools.partial(produce, list(range(n, len(chunks), 2))) for n in (0, 1)}

    def make() -> Promoter:
        own = DelayStore.from_url(cluster.url, namespace=name, **CLIENT)
        return Promoter(own, ListDeliverer(deliver_client, {"ready": ListTarget(target)}), max_idle=1.0)

    with promoters(make, 2) as workers:
        with running(producers, stop, timeout=seconds + 30):
            deadline = started + seconds + 60.0
            while sum(p.counters.promoted for p in workers) < messages and time.monotonic() < deadline:
                time.sleep(0.05)
        promoted = sum(p.counters.promoted for p in workers)
        elapsed = time.monotonic() - started
    usec = [script_usec(master) for master in masters]
    delivered = int(deliver_client.llen(target))
    delete_store(store)
    deliver_client.delete(target)
    store.client.close()
    total = sum(usec)
    shares = [value / total for value in usec]
    return {
        "shares": shares,
        "usec": usec,
        "promoted": promoted,
        "delivered": delivered,
        "elapsed": elapsed,
        "failures": failures,
        "errors": sum(p.counters.errors for p in workers),
    }


def capacity(cluster: RedisClusterServers, messages: int, payload: int) -> dict[str, Any]:
    """used_memory growth of the same far-future messages on one server and on each cluster master."""
    body = b"x" * payload
    ids = message_ids(messages)
    requests = [ParkRequest(id, Envelope("ready", body), delay=FAR) for id in ids]
    warm = [ParkRequest(f"warm-{n}", Envelope("ready", body), delay=FAR) for n in range(200)]

    with EmbeddedRedis() as server:
        client = server.client()
        single = DelayStore(client, namespace=namespace("cap"))
        single.park_many(warm)  # scripts loaded, keys created: only the messages' own memory is measured
        before = used_memory(client)
        started = time.perf_counter()
        single.park_many(requests)
        single_seconds = time.perf_counter() - started
        single_growth = used_memory(client) - before
        client.close()

    store = DelayStore.from_url(cluster.url, namespace=namespace("cap"), shards=SHARDS, **CLIENT)
    masters = [cluster.node_client(index) for index in range(cluster.masters)]
    store.park_many(warm)
    before_each = [used_memory(master) for master in masters]
    started = time.perf_counter()
    store.park_many(requests)
    cluster_seconds = time.perf_counter() - started
    growth = [used_memory(master) - b for master, b in zip(masters, before_each, strict=True)]
    delete_store(store)
    store.client.close()
    return {
        "single": single_growth,
        "growth": growth,
        "ratio": max(growth) / single_growth,
        "single_rate": messages / single_seconds,
        "cluster_rate": messages / cluster_seconds,
    }


# ------------------------------------------------------------------------------------------------- failover


def failover_parks(replicas: int, rate: float, before: float, after: float) -> dict[str, Any]:
    """A producer parks far-future messages at ``rate``/s, retrying each id until acknowledged, through a
    failover; the acknowledged ids the new master does not hold."""
    with SentinelSet() as sentinel:
        store = DelayStore.from_url(
            sentinel.url, namespace=namespace("fo"), replicas=replicas, replica_timeout=0.5, **CLIENT
        )
        acknowledged: list[str] = []
        refused = Counter[str]()
        stop = threading.Event()

        def produce() -> None:
            n, next_at = 0, time.monotonic()
            while not stop.is_set():
                stop.wait(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at + 1.0 / rate, time.monotonic())  # no burst to catch up after an outage
                id = f"p-{n}"
                while not stop.is_set():  # the same id until it is acknowledged (stop bounds it)
                    try:
                        store.park(id, Envelope("ready", id.encode()), delay=FAR)
                    except RETRYABLE as error:
                        refused[type(error).__name__] += 1
                        time.sleep(0.05)
                        continue
                    acknowledged.append(id)
                    break
                n += 1

        with running({"producer": produce}, stop):
            time.sleep(before)
            took = sentinel.failover()
            time.sleep(after)
        master = sentinel.master_client()
        stored = {member.decode() for member in master.zrange(store.keys.due, 0, -1)}
        lost = [id for id in acknowledged if id not in stored]
        store.client.close()
    return {"acknowledged": len(acknowledged), "lost": len(lost), "refused": dict(refused), "failover": took}


def failover_exactly_once(replicas: int, rate: float, seconds: float, failover_at: float) -> dict[str, Any]:
    """Messages come due at ``rate``/s for ``seconds``; 2 exactly-once promoters move them into a list of the
    same master and a consumer BRPOPs them through Sentinel; a failover ``failover_at`` s into the run."""
    with SentinelSet() as sentinel:
        name = namespace("eo")
        target = f"{name}:ready"
        store = DelayStore.from_url(sentinel.url, namespace=name, replicas=replicas, replica_timeout=0.5, **CLIENT)
        lead = 1.0
        count = int(rate * seconds)
        ids = [f"e-{n}" for n in range(count)]
        requests = [ParkRequest(id, Envelope("ready", id.encode()), delay=lead + n / rate) for n, id in enumerate(ids)]
        preparks = retried(lambda: store.park_many(requests), seconds=10.0)
        t0 = time.monotonic()
        # The parks themselves on the replica before anything happens: this measures promotion, not parking.
        sentinel.master_client().wait(1, 5000)
        consumed: list[tuple[float, str]] = []
        refused = Counter[str]()
        stop = threading.Event()

        def consume() -> None:
            client = client_from_url(sentinel.url, **CLIENT)
            try:
                while not stop.is_set():
                    try:
                        popped = client.brpop([target], timeout=1)
                    except CONSUMER_RETRYABLE as error:
                        refused[type(error).__name__] += 1
                        time.sleep(0.05)
                        continue
                    if popped is not None:
                        consumed.append((time.monotonic(), popped[1].decode()))
            finally:
                client.close()

        def make() -> Promoter:
            own = DelayStore.from_url(sentinel.url, namespace=name, replicas=replicas, replica_timeout=0.5, **CLIENT)
            return Promoter(own, DirectLists({"ready": ListTarget(target)}))

        with promoters(make, 2) as workers, running({"consumer": consume}, stop):
            time.sleep(max(0.0, t0 + failover_at - time.monotonic()))
            failover_start = time.monotonic()
            took = sentinel.failover()
            failover_end = time.monotonic()
            master = sentinel.master_client()
            deadline = t0 + lead + seconds + 30.0
            settled = False
            while time.monotonic() < deadline:
                seen = {id for _, id in consumed}
                if len(seen) >= count and master.zcard(store.keys.due) == 0 and master.llen(target) == 0:
                    settled = True
                    break
                time.sleep(0.1)
            time.sleep(0.5)  # a duplicate pushed at the very end is consumed too
            errors = sum(p.counters.errors for p in workers)
        store.client.close()
    times = Counter(id for _, id in consumed)
    return {
        "duplicates": sum(1 for n in times.values() if n > 1),
        "lost": sum(1 for id in ids if id not in times),
        "consumed": len(consumed),
        "count": count,
        "failover": took,
        "recovery": recovery([at for at, _ in consumed], failover_start, failover_end),
        "settled": settled,
        "refused": dict(refused),
        "promoter_errors": errors,
        "prepark_retries": preparks,
    }


def retried(call: Callable[[], object], seconds: float) -> list[str]:
    """Call until it does not raise a retryable error (parking again is safe); the errors it raised."""
    deadline = time.monotonic() + seconds
    errors: list[str] = []
    while True:
        try:
            call()
            return errors
        except RETRYABLE as error:
            errors.append(f"{type(error).__name__}: {error}")
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def recovery(times: list[float], start: float, end: float) -> float:
    """The end of the longest pause in consumption that overlaps [start, end], minus ``start``."""
    ordered = sorted(times)
    longest: tuple[float, float] | None = None
    for before, after in itertools.pairwise(ordered):
        if before < end and after > start and (longest is None or after - before > longest[1] - longest[0]):
            longest = (before, after)
    return math.nan if longest is None else longest[1] - start


# ------------------------------------------------------------------------------------------------- rebalance


def report_rebalance() -> None:
    plan = PLAN
    say(
        f"Redis Cluster of 3 masters, each with a replica; 2 producers park {plan.rate:.0f}/s each (due in 1-4 s, or "
        f"packed and due in 12-24 s), 2 at-least-once promoters (shards={plan.shards}) and 2 exactly-once ones (a "
        f"1-shard namespace whose slot moves); {plan.backlog} far-future messages of {plan.backlog_payload} B per "
        f"namespace; after {plan.warmup:.0f} s a 4th master is added and `redis-cli --cluster rebalance "
        f"--cluster-use-empty-masters --cluster-pipeline {plan.pipeline}` run; {plan.after:.0f} s more load, then "
        "every message waited for"
    )
    figures, moves = rebalance_under_load(plan)
    say(
        f"acknowledged {figures['acknowledged']}, duplicates {figures['duplicates']} (at-least-once bound "
        f"{figures['duplicate_bound']}: batch x promoter errors {figures['promoter_errors']}), early "
        f"{figures['early']}, packed {figures['packed']}, park attempts refused {figures['refused'] or 'none'}; "
        f"rebalance {figures['rebalance_seconds']:.1f} s, {figures['moved_shards']} of {plan.shards} shards moved "
        f"(and the exactly-once one: {figures['exactly_once_moved']}), {figures['masters']} masters after; "
        f"TRYAGAIN/ASK/MOVED replies {figures['redirects']}; lateness max {figures['max_lateness_ms']} ms; "
        f"reader (stats, a page, a message by id every 0.1 s): {figures['reads']} rounds, errors "
        f"{figures['read_errors'] or 'none'}"
    )
    out("rebalance_lost", sum(figures["lost"].values()))
    out("rebalance_dup_exactly_once", figures["duplicates"]["exactly_once"])
    out("rebalance_dup_at_least_once", figures["duplicates"]["at_least_once"])
    out("rebalance_early", figures["early"])
    out("rebalance_s", figures["rebalance_seconds"])
    say(
        "rebalance_max_pause_s: the longest gap between two promotions of one namespace overlapping the rebalance "
        f"(at least once, 12 shards: {figures['max_pause_s']['at_least_once']:.3f} s; exactly once, its slot moved: "
        f"{figures['max_pause_s']['exactly_once']:.3f} s)"
    )
    out("rebalance_max_pause_s", max(figures["max_pause_s"].values()))
    say(
        "MIGRATE of a shard's big keys to another master (250 B payloads): one pack (messages due at the same time), "
        "or the ordinary layout's due + msg; a probe PINGs the source master back to back meanwhile: the move's "
        "time, and the longest PING (the master blocked)"
    )
    for move in moves["moves"]:
        say(
            f"  {move['messages']} messages, {move['what']}: {move['bytes'] / 1e6:.1f} MB (MEMORY USAGE), MIGRATE "
            f"{move['seconds'] * 1000:.0f} ms, longest PING {move['longest_ping'] * 1000:.0f} ms"
        )
        label = "pack" if move["what"] == "one pack" else "ordinary"
        out(f"migrate_{label}_{move['messages']}_s", move["seconds"])
        out(f"migrate_{label}_{move['messages']}_longest_ping_s", move["longest_ping"])


# ------------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--cluster-messages", type=int, default=60_000)
    parser.add_argument("--cluster-seconds", type=float, default=10.0)
    parser.add_argument("--capacity-messages", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=250)
    parser.add_argument("--rate", type=float, default=250.0, help="parks/s and messages due/s in the failovers")
    parser.add_argument("--verbose", action="store_true", help="show delay_broker's warnings (backoffs, failovers)")
    options = parser.parse_args()
    only = {item.strip() for item in options.only.split(",") if item.strip()}
    if only - set(SECTIONS):
        parser.error(f"unknown section(s) {sorted(only - set(SECTIONS))}; choose from {SECTIONS}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not options.verbose:
        logging.getLogger("delay_broker").setLevel(logging.ERROR)
    wall = time.monotonic()

    if only & {"cluster", "capacity"}:
        with RedisClusterServers(3) as cluster:
            say(f"Redis Cluster of 3 masters up in {cluster.startup_seconds:.1f} s; namespaces with shards={SHARDS}")
            if "cluster" in only:
                result = cluster_shares(cluster, options.cluster_messages, options.cluster_seconds, 500)
                say(
                    f"{options.cluster_messages} messages parked by 2 producers over {options.cluster_seconds:.0f} s "
                    f"(park_many, 500 a call), promoted by 2 at-least-once promoters (ListDeliverer): "
                    f"{result['promoted']} promoted, {result['delivered']} in the target list, "
                    f"{result['elapsed']:.1f} s, promoter errors {result['errors']}"
                )
                if result["failures"]:
                    say(f"WARNING: {len(result['failures'])} park_many calls failed, first: {result['failures'][0]}")
                say(
                    "each master's share of the namespace's server time (usec of EVALSHA+EVAL in INFO commandstats; "
                    "the deliverer's LPUSH to the target list excluded), target 0.23-0.43 each:"
                )
                for index, (share, usec) in enumerate(zip(result["shares"], result["usec"], strict=True)):
                    say(f"  master {index}: {usec / 1e6:.2f} s of script time")
                    out(f"cluster_server_share_master{index}", share)
                out("cluster_server_share_min", min(result["shares"]))
                out("cluster_server_share_max", max(result["shares"]))
            if "capacity" in only:
                result = capacity(cluster, options.capacity_messages, options.payload)
                say(
                    f"{options.capacity_messages} far-future messages of {options.payload} B parked on one server "
                    f"(+{result['single'] / 1e6:.1f} MB used_memory, {result['single_rate']:,.0f} msgs/s) and on the "
                    f"cluster (per master +{', +'.join(f'{g / 1e6:.1f}' for g in result['growth'])} MB, "
                    f"{result['cluster_rate']:,.0f} msgs/s). Ratio = largest master's growth / one server's, "
                    "expected ~1/3:"
                )
                out("cluster_capacity_ratio", result["ratio"])

    if "failover" in only:
        rate = options.rate
        failovers: list[float] = []
        say(
            f"Sentinel set (1 master, 1 replica, 1 Sentinel; fresh per scenario): a producer parks far-future "
            f"messages at {rate:.0f}/s for 4 s, SENTINEL FAILOVER, parks 4 s more; a park that raises is retried "
            "with the same id; lost = acknowledged ids missing from the new master's due set"
        )
        for replicas, label in ((0, "default"), (1, "durable")):
            result = failover_parks(replicas, rate, before=4.0, after=4.0)
            failovers.append(result["failover"])
            say(
                f"replicas={replicas}: {result['acknowledged']} acknowledged, {result['lost']} lost, failover "
                f"{result['failover']:.1f} s, park attempts refused: {result['refused'] or 'none'}"
            )
            out(f"failover_acknowledged_{label}", result["acknowledged"])
            out(f"failover_lost_{label}", result["lost"])
        say(
            f"exactly-once promotion (DirectLists into a list of the same master, 2 promoters) of messages due at "
            f"{rate:.0f}/s for 14 s, consumer BRPOPs through Sentinel; failover 5 s in; counted once everything "
            "due is promoted and consumed: dup = consumed more than once, lost = never consumed"
        )
        recoveries: dict[str, tuple[float, float]] = {}
        for replicas, suffix in ((0, ""), (1, "_durable")):
            result = failover_exactly_once(replicas, rate, seconds=14.0, failover_at=5.0)
            failovers.append(result["failover"])
            recoveries[suffix] = (result["recovery"], result["failover"])
            say(
                f"replicas={replicas}: {result['count']} messages, {result['consumed']} consumed, failover "
                f"{result['failover']:.1f} s, consumption resumed {fmt(result['recovery'])} s after SENTINEL "
                f"FAILOVER; promoter errors (backoffs) {result['promoter_errors']}, consumer retries "
                f"{result['refused'] or 'none'}{'' if result['settled'] else '; NOT SETTLED by the deadline'}"
            )
            if result["prepark_retries"]:
                say(
                    f"  note: parking the messages before the run (no failover yet) was refused "
                    f"{len(result['prepark_retries'])} time(s) and retried; first: {result['prepark_retries'][0]}"
                )
            out(f"failover_dup_exactly_once{suffix}", result["duplicates"])
            out(f"failover_lost_exactly_once{suffix}", result["lost"])
        say(
            f"failover_s: median of the {len(failovers)} failovers ({', '.join(f'{s:.1f}' for s in failovers)} s), "
            "SENTINEL FAILOVER until the set is healthy again. failover_recovery_s: SENTINEL FAILOVER to the end of "
            "the longest pause in consumption overlapping the failover; target <= that run's failover time + 2 s"
        )
        out("failover_s", median(failovers))
        for suffix, (value, took) in recoveries.items():
            say(f"  recovery{suffix or ' (replicas=0)'}: {fmt(value)} s, its failover {took:.1f} s")
            out(f"failover_recovery_s{suffix}", value)

    if "rebalance" in only:
        report_rebalance()

    out("wall_s", time.monotonic() - wall)


if __name__ == "__main__":
    main()
