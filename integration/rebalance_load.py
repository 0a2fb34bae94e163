"""A whole Redis Cluster rebalance under load, run by integration/test_store_rebalance.py (small) and
benchmarks/bench_scale.py (bigger): a master added and the slots rebalanced onto it with ``redis-cli --cluster``
while producers park and promoters promote.

- A namespace of ``shards`` shards, parked into by 2 producer threads (each message due within seconds, or due
  later and packed, its pack opened during the run) and promoted at least once into a list by 2 promoters.
- A namespace of one shard whose slot the rebalance moves, parked into by the same producers and promoted exactly
  once (``DirectLists``) into a list of its own slot by 2 more promoters: exactly-once promotion on a Cluster
  needs the target in the store's slot, which a sharded namespace cannot give (``check_direct``).
- A consumer pops both lists; every message says when it is due, so an early promotion is seen.
- A reader does what the CLI and the dashboard do (stats, the first page of messages, a message by id), with a
  store of its own, all along.

Every park is made again with the same id and due time until it is acknowledged; lost = acknowledged, never
consumed. An at-least-once message is delivered again only when its claim's acknowledgement failed for the whole
lease, which fails the promoter's cycle: duplicates <= ``batch`` x the at-least-once promoters' errors.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

import redis
from redis.crc import key_slot

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter, StoreError
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.redis_errors import ask_to_unknown_node
from delay_broker.reports import PromoterListener
from tests.helpers import threads_running

from .cluster_moves import add_master, rebalance, slot_owners
from .ha_servers import RedisClusterServers

SOON = (1.0, 4.0)
"""Delays (s) of the messages due within seconds: the ordinary layout."""
LATER = (12.0, 24.0)
"""Delays (s) of the packed messages (``pack_after`` 10 s): their packs are opened 5 s before they are due."""
PACK_AFTER = 10.0
CLIENT = {"socket_timeout": 5.0}


@dataclass(frozen=True)
class Plan:
    rate: float = 40.0
    """Parks per second of each of the 2 producers."""
    warmup: float = 4.0
    """Seconds of load before the master is added."""
    after: float = 4.0
    """Seconds of load after the rebalance."""
    pipeline: int = 2
    """``--cluster-pipeline``: keys per ``MIGRATE``."""
    shards: int = 12
    batch: int = 100
    lease: float = 10.0
    exactly_once_share: float = 0.25
    packed_share: float = 0.4
    backlog: int = 2000
    """Messages due in a day parked before the run, in packs: larger keys for each slot's move."""
    backlog_payload: int = 1000


@dataclass
class Outcome:
    acknowledged: dict[str, int]
    """Parks acknowledged, per promotion (``at_least_once``, ``exactly_once``)."""
    lost: dict[str, int]
    duplicates: dict[str, int]
    duplicate_bound: int
    early: int
    packed: int
    """Packed messages parked (each opened from its pack during the run) and acknowledged."""
    refused: dict[str, int]
    """Park attempts refused, by error (each made again)."""
    promoter_errors: dict[str, int]
    rebalance_seconds: float
    max_pause_s: dict[str, float]
    """Per namespace, the longest gap between two of its promotions (by any of its promoters) that overlaps the
    rebalance."""
    max_lateness_ms: int
    min_lateness_ms: int
    moved_shards: int
    exactly_once_moved: bool
    masters: int
    """Masters serving slots at the end."""
    redirects: dict[str, int]
    """TRYAGAIN, ASK and MOVED replies the masters gave during the run (``INFO errorstats``)."""
    resumed: bool
    """Promotions seen in each namespace after the rebalance, before the drain."""
    reads: int
    """Rounds of reads (stats, a page, a message by id) the reader made."""
    read_errors: dict[str, int]
    output: str = field(repr=False, default="")


class Ledger:
    """What was acknowledged and what was consumed, by id, with times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parked: dict[str, tuple[str, int]] = {}
        """id -> (promotion kind, due ms)."""
        self.packed = 0
        self.consumed: dict[str, list[int]] = {}
        self.refused = Counter[str]()
        self.promotions: dict[str, list[float]] = {"at_least_once": [], "exactly_once": []}
        self.reads = 0
        self.read_errors = Counter[str]()

    def park_acknowledged(self, id: str, kind: str, due_ms: int, packed: bool) -> None:
        with self.lock:
            self.parked[id] = (kind, due_ms)
            self.packed += packed

    def popped(self, items: Sequence[bytes], at_ms: int) -> None:
        with self.lock:
            for item in items:
                self.consumed.setdefault(item.decode().split(" ")[0], []).append(at_ms)

    def waiting(self) -> int:
        with self.lock:
            return sum(1 for id in self.parked if id not in self.consumed)


class Times(PromoterListener):
    def __init__(self, ledger: Ledger, kind: str) -> None:
        self.ledger = ledger
        self.kind = kind

    def promoted(self, lateness_ms: Sequence[int]) -> None:
        with self.ledger.lock:
            self.ledger.promotions[self.kind].append(time.monotonic())


def run(cluster: RedisClusterServers, plan: Plan) -> Outcome:
    """The run: load, a 4th master added, ``rebalance``, load again, then every message waited for (see above)."""
    owners = slot_owners(cluster)
    names = {"at_least_once": f"rb-{uuid.uuid4().hex[:8]}", "exactly_once": _moving_namespace(owners)}
    shards = {"at_least_once": plan.shards, "exactly_once": 1}
    stores = {
        kind: DelayStore.from_url(cluster.url, namespace=name, shards=shards[kind], pack_after=PACK_AFTER, **CLIENT)
        for kind, name in names.items()
    }
    targets = {kind: f"{{{name}}}:ready" for kind, name in names.items()}
    for store in stores.values():
        store.shard_for("")  # the shard counts recorded before the promoters read them
        body = b"b" * plan.backlog_payload
        store.park_many(
            [ParkRequest(str(uuid.uuid4()), Envelope("ready", body), delay=86400) for _ in range(plan.backlog)]
        )
    ledger = Ledger()
    before = _redirects(cluster)
    producing, consuming = threading.Event(), threading.Event()
    producers = {f"producer-{n}": _producer(stores, plan, ledger, producing) for n in range(2)}
    with ExitStack() as stack:
        background = {
            "consumer": _consumer(cluster, targets, ledger, consuming),
            "reader": _reader(cluster, names, ledger, consuming),
        }
        stack.enter_context(threads_running(background, consuming))
        promoters = stack.enter_context(_promoters(cluster, names, targets, plan, ledger))
        with threads_running(producers, producing):
            time.sleep(plan.warmup)
            add_master(cluster)
            started = time.monotonic()
            rebalanced = rebalance(cluster, pipeline=plan.pipeline)
            ended = time.monotonic()
            time.sleep(plan.after)
        resumed = all(any(at > ended for at in times) for times in ledger.promotions.values())
        deadline = time.monotonic() + LATER[1] + 30.0
        while ledger.waiting() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a duplicate made at the very end is consumed too
        errors = {kind: sum(p.counters.errors for p in group) for kind, group in promoters.items()}
        lateness = [ms for group in promoters.values() for p in group for ms in p.counters.lateness_ms]
    after = slot_owners(cluster)
    outcome = _count(ledger, plan, errors, lateness, started, ended)
    outcome.rebalance_seconds, outcome.output, outcome.resumed = rebalanced.seconds, rebalanced.output, resumed
    outcome.moved_shards = sum(1 for s in stores["at_least_once"].shards if _moved(s.due, owners, after))
    outcome.exactly_once_moved = _moved(stores["exactly_once"].keys.due, owners, after)
    outcome.masters = len(set(after.values()))
    outcome.redirects = {code: count - before[code] for code, count in _redirects(cluster).items()}
    for store in stores.values():
        store.client.close()
    return outcome


def _count(
    ledger: Ledger, plan: Plan, errors: dict[str, int], lateness: list[int], started: float, ended: float
) -> Outcome:
    kinds = ("at_least_once", "exactly_once")
    lost = dict.fromkeys(kinds, 0)
    duplicates = dict.fromkeys(kinds, 0)
    acknowledged = dict.fromkeys(kinds, 0)
    early = 0
    for id, (kind, due_ms) in ledger.parked.items():
        acknowledged[kind] += 1
        times = ledger.consumed.get(id, [])
        lost[kind] += not times
        duplicates[kind] += max(0, len(times) - 1)
        early += sum(1 for at in times if at < due_ms)
    return Outcome(
        acknowledged=acknowledged,
        lost=lost,
        duplicates=duplicates,
        duplicate_bound=plan.batch * errors["at_least_once"],
        early=early,
        packed=ledger.packed,
        refused=dict(ledger.refused),
        promoter_errors=errors,
        rebalance_seconds=0.0,
        max_pause_s={kind: longest_gap(times, started, ended) for kind, times in ledger.promotions.items()},
        max_lateness_ms=max(lateness, default=0),
        min_lateness_ms=min(lateness, default=0),
        moved_shards=0,
        exactly_once_moved=False,
        masters=0,
        redirects={},
        resumed=False,
        reads=ledger.reads,
        read_errors=dict(ledger.read_errors),
    )


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval between two consecutive ``times`` that overlaps [start, end]."""
    ordered = sorted(times)
    gaps = [after - before for before, after in itertools.pairwise(ordered) if before < end and after > start]
    return max(gaps, default=float("nan"))


def _moving_namespace(owners: dict[int, int]) -> str:
    """A namespace whose slot ``rebalance`` moves: ``redis-cli`` takes the new master's share from the lowest slots of
    each master, so one among the first thousand of a master's."""
    firsts = [min(slot for slot, owner in owners.items() if owner == master) for master in set(owners.values())]
    for n in itertools.count():
        name = f"eo-{uuid.uuid4().hex[:6]}-{n}"
        if any(first <= key_slot(name.encode()) < first + 1000 for first in firsts):
            return name
    raise AssertionError("unreachable")


def _moved(key: str, before: dict[int, int], after: dict[int, int]) -> bool:
    slot = key_slot(key.encode())
    return before[slot] != after[slot]


def _redirects(cluster: RedisClusterServers) -> dict[str, int]:
    counts = dict.fromkeys(("TRYAGAIN", "ASK", "MOVED"), 0)
    for node in cluster.nodes:
        client = node.client(socket_timeout=5)
        try:
            stats = client.info("errorstats")
        finally:
            client.close()
        for code in counts:
            counts[code] += int(stats.get(f"errorstat_{code}", {}).get("count", 0))
    return counts


def _producer(stores: dict[str, DelayStore], plan: Plan, ledger: Ledger, stop: threading.Event) -> Callable[[], None]:
    def produce() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at + 1.0 / plan.rate, time.monotonic())  # no burst to catch up after a stall
            kind = "exactly_once" if random.random() < plan.exactly_once_share else "at_least_once"
            packed = random.random() < plan.packed_share
            delay = random.uniform(*(LATER if packed else SOON))
            due = datetime.fromtimestamp(time.time() + delay, timezone.utc)
            due_ms = int(due.timestamp() * 1000)
            id = str(uuid.uuid4())
            envelope = Envelope("ready", f"{id} {due_ms}".encode())
            while not stop.is_set():  # the same id and due time until acknowledged (parking again is safe)
                try:
                    stores[kind].park(id, envelope, due=due)
                except StoreError as error:
                    ledger.refused[type(error).__name__] += 1
                    time.sleep(0.05)
                    continue
                ledger.park_acknowledged(id, kind, due_ms, packed)
                break

    return produce


def _consumer(
    cluster: RedisClusterServers, targets: dict[str, str], ledger: Ledger, stop: threading.Event
) -> Callable[[], None]:
    def consume() -> None:
        client = cluster.client(**CLIENT)
        while not stop.is_set():
            found = False
            for key in targets.values():
                try:
                    items = client.rpop(key, 500)
                except (redis.RedisError, redis.exceptions.RedisClusterException, AttributeError) as error:
                    if isinstance(error, AttributeError) and not ask_to_unknown_node(error):
                        raise
                    time.sleep(0.05)  # the list's slot moving (to a master redis-py does not know yet): again
                    continue
                if items:
                    ledger.popped(items, int(time.time() * 1000))
                    found = True
            if not found:
                stop.wait(0.005)

    return consume


def _reader(
    cluster: RedisClusterServers, names: dict[str, str], ledger: Ledger, stop: threading.Event
) -> Callable[[], None]:
    def read() -> None:
        store = DelayStore.from_url(cluster.url, namespace=names["at_least_once"], **CLIENT)
        while not stop.wait(0.1):
            with ledger.lock:
                some = next(reversed(ledger.parked), None) if ledger.parked else None
            try:
                store.stats()
                store.list_messages("due", count=20)
                if some is not None:
                    store.get(some)
            except StoreError as error:
                ledger.read_errors[type(error).__name__] += 1
                continue
            ledger.reads += 1
        store.client.close()

    return read


@contextmanager
def _promoters(
    cluster: RedisClusterServers, names: dict[str, str], targets: dict[str, str], plan: Plan, ledger: Ledger
) -> Iterator[dict[str, list[Promoter]]]:
    """2 promoters per namespace, each with a store (and a client) of its own, as separate processes have."""
    started: dict[str, list[Promoter]] = {kind: [] for kind in names}
    try:
        for kind, name in names.items():
            for _ in range(2):
                store = DelayStore.from_url(cluster.url, namespace=name, pack_after=PACK_AFTER, **CLIENT)
                route = {"ready": ListTarget(targets[kind])}
                deliverer = DirectLists(route) if kind == "exactly_once" else ListDeliverer(store.client, route)
                options = {"batch": plan.batch, "lease": plan.lease, "max_idle": 1.0, "keep_lateness": True}
                promoter = Promoter(store, deliverer, listener=Times(ledger, kind), **options)
                started[kind].append(promoter.start())
        yield started
    finally:
        for group in started.values():
            for promoter in group:
                promoter.stop(timeout=15.0)
                promoter.store.client.close()
