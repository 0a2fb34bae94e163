"""A namespace resharded under load with ``delay-broker reshard``, the command SIGKILLed midway and run again; run by
integration/test_store_reshard.py (small) and benchmarks/bench_scale.py (bigger). On one Redis server, where
exactly-once promotion works with several shards, or on a Redis Cluster, where ``check_direct`` refuses it and
promotion is at least once:

- A namespace of ``source`` shards, parked into by 2 producer threads (each message due within seconds, or later
  and packed) and promoted into a list by 2 promoters, each with a store of its own: exactly once
  (``DirectLists``), or at least once (``ListDeliverer``).
- A backlog parked before the run: half due during the reshard (so promoted from their new homes as they arrive),
  half due in a day (packed; moved, never promoted during the run).
- ``delay-broker reshard --to <target> --yes`` in a process of its own, SIGKILLed once it has moved a share of
  the backlog, then run again to the end (it waits for the killed run's lock first).
- A consumer pops the list; every message says when it is due, so an early promotion is seen.
- A reader reads a backlog message due in a day by id all along (it must be found in either layout, or in
  transit), and a page and the counts, as the CLI and the dashboard do.

Every park is made again with the same id and due time until it is acknowledged; lost = acknowledged, never
consumed (or, for the day-ahead backlog, no longer found); duplicated = consumed twice. At least once, a message
runs again only when its claim's acknowledgement failed for the whole lease, which fails the promoter's cycle:
duplicates <= the promoters' batch x their errors.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter, StoreError
from delay_broker.connect import client_from_url
from delay_broker.deliverers import DirectLists, ListDeliverer
from tests.helpers import threads_running

SOON = (1.0, 4.0)
"""Delays (s) of the producers' messages due within seconds: the ordinary layout."""
LATER = (11.0, 15.0)
"""Delays (s) of their packed messages (``pack_after`` 10 s): their packs are opened 5 s before they are due."""
PACK_AFTER = 10.0
BATCH = 200
"""The promoters' batch."""
CLIENT = {"socket_timeout": 10.0}


@dataclass(frozen=True)
class Plan:
    rate: float = 40.0
    """Parks per second of each of the 2 producers."""
    warmup: float = 3.0
    """Seconds of load before the reshard starts."""
    after: float = 3.0
    """Seconds of load after it has finished."""
    source: int = 3
    target: int = 12
    settle: float = 3.0
    """The reshard's ``--settle``."""
    batch: int = 100
    backlog: int = 10_000
    """Messages parked before the run (half due during the reshard, half in a day)."""
    kill_at: float = 0.3
    """The share of the backlog's moves after which the first run is killed."""
    packed_share: float = 0.4
    exactly_once: bool = True
    """Promote with ``DirectLists`` (one server only), else with a ``ListDeliverer``."""


@dataclass
class Outcome:
    acknowledged: int
    """Parks acknowledged to the producers during the run (besides the backlog)."""
    backlog: int
    lost: int
    duplicated: int
    early: int
    killed_midway: bool
    """The first run was killed with messages left to move (the layout still moving)."""
    moved_before_kill: int
    moved: int
    """Messages re-homed by both runs (the ``rehomed`` counters)."""
    rerun: dict[str, object]
    """The second run's report (``--json``)."""
    refused: dict[str, int]
    """Park attempts refused, by error (each made again)."""
    read_misses: int
    """Reads by id of a parked message that found nothing (must be 0)."""
    reads: int
    max_lateness_ms: int
    promoter_errors: int
    duplicate_bound: int
    """At least once: the promoters' batch x their errors (0 exactly once)."""
    shards_after: int
    layout_after: str
    output: str = field(repr=False, default="")


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parked: dict[str, int] = {}
        """id -> due ms, acknowledged."""
        self.consumed: dict[str, list[int]] = {}
        self.refused = Counter[str]()
        self.reads = 0
        self.read_misses = 0

    def popped(self, items: list[bytes], at_ms: int) -> None:
        with self.lock:
            for item in items:
                self.consumed.setdefault(item.decode().split(" ")[0], []).append(at_ms)

    def waiting(self) -> int:
        with self.lock:
            return sum(1 for id in self.parked if id not in self.consumed)


def run(url: str, plan: Plan) -> Outcome:
    """The run: backlog, load, the reshard killed and run again, load, every message waited for (see above)."""
    namespace = f"rs-{uuid.uuid4().hex[:8]}"
    target = f"{namespace}:ready"
    store = DelayStore.from_url(url, namespace=namespace, shards=plan.source, pack_after=PACK_AFTER, **CLIENT)
    ledger = Ledger()
    day = _park_backlog(store, plan, ledger)
    producing, consuming = threading.Event(), threading.Event()
    with ExitStack() as stack:
        background = {
            "consumer": _consumer(url, target, ledger, consuming),
            "reader": _reader(url, namespace, day, ledger, consuming),
        }
        stack.enter_context(threads_running(background, consuming))
        promoters = stack.enter_context(_promoters(url, namespace, target, plan.exactly_once))
        with threads_running({f"producer-{n}": _producer(store, plan, ledger, producing) for n in range(2)}, producing):
            time.sleep(plan.warmup)
            killed, before_kill, output = _killed_run(url, namespace, plan, store)
            rerun = _reshard(url, namespace, plan, check=True)
            time.sleep(plan.after)
        deadline = time.monotonic() + LATER[1] + 30.0
        while ledger.waiting() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a duplicate made at the very end is consumed too
        errors = sum(promoter.counters.errors for promoter in promoters)
        lateness = [ms for promoter in promoters for ms in promoter.counters.lateness_ms]
    after = DelayStore.from_url(url, namespace=namespace, **CLIENT)
    found = sum(1 for id in day if after.get(id) is not None)
    lost = sum(1 for id in ledger.parked if id not in ledger.consumed) + len(day) - found
    outcome = Outcome(
        acknowledged=len(ledger.parked) - plan.backlog // 2,
        backlog=plan.backlog,
        lost=lost,
        duplicated=sum(len(times) - 1 for times in ledger.consumed.values() if len(times) > 1),
        early=sum(1 for id, times in ledger.consumed.items() for at in times if at < ledger.parked.get(id, 0)),
        killed_midway=killed,
        moved_before_kill=before_kill,
        moved=int(after.stats().counters.get("rehomed", 0)),
        rerun=json.loads(rerun[rerun.index("{") :]),
        refused=dict(ledger.refused),
        read_misses=ledger.read_misses,
        reads=ledger.reads,
        max_lateness_ms=max(lateness, default=0),
        promoter_errors=errors,
        duplicate_bound=0 if plan.exactly_once else BATCH * errors,
        shards_after=after.stats().shards,
        layout_after=(after.client.get(after.keys.layout) or b"").decode(),  # type: ignore[union-attr]
        output=output + rerun,
    )
    _delete(after)
    store.client.close()
    after.client.close()
    return outcome


def _park_backlog(store: DelayStore, plan: Plan, ledger: Ledger) -> list[str]:
    """The backlog: half due during the reshard (after the warmup and the settle, over some seconds), half in a day;
    the ids of the latter."""
    store.shard_for("")  # the shard count recorded before the promoters read it
    now = time.time()
    soon_ids = [str(uuid.uuid4()) for _ in range(plan.backlog // 2)]
    day_ids = [str(uuid.uuid4()) for _ in range(plan.backlog - len(soon_ids))]
    requests = []
    for id in soon_ids:
        due_ms = int((now + plan.warmup + plan.settle + random.uniform(1.0, 8.0)) * 1000)
        requests.append(ParkRequest(id, Envelope("ready", f"{id} {due_ms}".encode()), due=_at(due_ms)))
        ledger.parked[id] = due_ms
    requests.extend(ParkRequest(id, Envelope("ready", id.encode()), delay=86_400) for id in day_ids)
    for start in range(0, len(requests), 1000):
        store.park_many(requests[start : start + 1000])
    return day_ids


def _at(due_ms: int) -> datetime:
    return datetime.fromtimestamp(due_ms / 1000, timezone.utc)


def _command(url: str, namespace: str, plan: Plan) -> list[str]:
    return [
        sys.executable, "-m", "delay_broker", "reshard", "--to", str(plan.target), "--yes", "--json",
        "-r", url, "-n", namespace, "--settle", str(plan.settle), "--batch", str(plan.batch),
    ]  # fmt: skip


def _killed_run(url: str, namespace: str, plan: Plan, store: DelayStore) -> tuple[bool, int, str]:
    """The reshard started, SIGKILLed once it has moved ``kill_at`` of the backlog: whether the layout was still
    moving then, and how many it had moved."""
    process = subprocess.Popen(_command(url, namespace, plan), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    threshold = int(plan.backlog * plan.kill_at * (plan.target - 1) / plan.target)
    moved = 0
    try:
        while process.poll() is None:
            moved = _rehomed(store)
            if moved >= threshold:
                os.kill(process.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
    finally:
        output = process.communicate(timeout=60)[0].decode(errors="replace")
    still_moving = b'"moving"' in (store.client.get(store.keys.layout) or b"")  # type: ignore[operator]
    return process.returncode == -signal.SIGKILL and still_moving, moved, output


def _rehomed(store: DelayStore) -> int:
    try:
        return int(store.stats().counters.get("rehomed", 0))
    except StoreError:
        return 0


def _reshard(url: str, namespace: str, plan: Plan, *, check: bool) -> str:
    done = subprocess.run(_command(url, namespace, plan), capture_output=True, timeout=300, check=False)
    output = done.stdout.decode(errors="replace")
    if check and done.returncode != 0:
        raise AssertionError(f"the reshard run again failed ({done.returncode}): {output} {done.stderr.decode()}")
    return output


def _producer(store: DelayStore, plan: Plan, ledger: Ledger, stop: threading.Event) -> Callable[[], None]:
    def produce() -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at + 1.0 / plan.rate, time.monotonic())
            delay = random.uniform(*(LATER if random.random() < plan.packed_share else SOON))
            due_ms = int((time.time() + delay) * 1000)
            id = str(uuid.uuid4())
            envelope = Envelope("ready", f"{id} {due_ms}".encode())
            while not stop.is_set():  # the same id and due time until acknowledged (parking again is safe)
                try:
                    store.park(id, envelope, due=_at(due_ms))
                except StoreError as error:
                    ledger.refused[type(error).__name__] += 1
                    time.sleep(0.05)
                    continue
                with ledger.lock:
                    ledger.parked[id] = due_ms
                break

    return produce


def _consumer(url: str, target: str, ledger: Ledger, stop: threading.Event) -> Callable[[], None]:
    def consume() -> None:
        client = client_from_url(url, **CLIENT)
        while not stop.is_set():
            items = client.rpop(target, 500)
            if items:
                ledger.popped(items, int(time.time() * 1000))  # type: ignore[arg-type]
            else:
                stop.wait(0.005)
        client.close()

    return consume


def _reader(url: str, namespace: str, day: list[str], ledger: Ledger, stop: threading.Event) -> Callable[[], None]:
    def read() -> None:
        store = DelayStore.from_url(url, namespace=namespace, **CLIENT)
        while not stop.wait(0.02):
            try:
                found = store.get(random.choice(day))
                store.list_messages("due", count=20)
                store.stats()
            except StoreError as error:
                ledger.refused[f"read {type(error).__name__}"] += 1
                continue
            ledger.reads += 1
            ledger.read_misses += found is None
        store.client.close()

    return read


@contextmanager
def _promoters(url: str, namespace: str, target: str, exactly_once: bool) -> Iterator[list[Promoter]]:
    """2 promoters, each with a store (and a client) of its own, as separate processes have."""
    started: list[Promoter] = []
    try:
        for _ in range(2):
            store = DelayStore.from_url(url, namespace=namespace, pack_after=PACK_AFTER, **CLIENT)
            route = {"ready": ListTarget(target)}
            deliverer = DirectLists(route) if exactly_once else ListDeliverer(store.client, route)
            promoter = Promoter(store, deliverer, batch=BATCH, lease=10.0, max_idle=1.0, keep_lateness=True)
            started.append(promoter.start())
        yield started
    finally:
        for promoter in started:
            promoter.stop(timeout=15.0)
            promoter.store.client.close()


def _delete(store: DelayStore) -> None:
    for key in store.client.scan_iter(f"{store.keys.prefix}:{{{store.keys.namespace}*"):
        store.client.delete(key)


__all__ = ["Outcome", "Plan", "run"]
