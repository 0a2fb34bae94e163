"""Runs the Dramatiq demo: the same delayed messages through a worker with delay_broker and through a
plain Dramatiq worker, side by side on one private Redis, with a live progress display."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ..store import DelayStore
from .dramatiq_app import boot_key, build, results_key
from .lists import percentile


@dataclass
class Side:
    """One worker process and what it has done."""

    name: str
    namespace: str
    park: bool
    process: subprocess.Popen[bytes] | None = None
    baseline_mb: float = 0.0
    peak_mb: float = 0.0
    runs: Counter[int] = field(default_factory=Counter)
    lateness_ms: list[float] = field(default_factory=list)

    @property
    def growth_mb(self) -> float:
        return max(0.0, self.peak_mb - self.baseline_mb)


@dataclass
class DramatiqDemoReport:
    messages: int
    ours: Side
    plain: Side
    seconds: float

    def executed(self, side: Side) -> int:
        return len(side.runs)

    def duplicates(self, side: Side) -> int:
        return sum(count - 1 for count in side.runs.values())

    def lost(self, side: Side) -> int:
        return self.messages - len(side.runs)

    def rows(self) -> list[tuple[str, str, str]]:
        ours, plain = self.ours, self.plain
        rows = [
            ("messages sent", str(self.messages), str(self.messages)),
            ("executed", str(self.executed(ours)), str(self.executed(plain))),
            ("duplicates", str(self.duplicates(ours)), str(self.duplicates(plain))),
            ("lost", str(self.lost(ours)), str(self.lost(plain))),
        ]
        for label, fraction in (("p50", 0.5), ("p99", 0.99)):
            rows.append(
                (
                    f"lateness {label}",
                    f"{percentile(ours.lateness_ms, fraction):.1f} ms",
                    f"{percentile(plain.lateness_ms, fraction):.1f} ms",
                )
            )
        rows.append(
            (
                "lateness max",
                f"{max(ours.lateness_ms, default=0):.1f} ms",
                f"{max(plain.lateness_ms, default=0):.1f} ms",
            )
        )
        rows.append(("worker memory growth", f"{ours.growth_mb:.1f} MB", f"{plain.growth_mb:.1f} MB"))
        rows.append(("wall time", f"{self.seconds:.1f} s", ""))
        return rows

    @property
    def ok(self) -> bool:
        return self.duplicates(self.ours) == 0 and self.lost(self.ours) == 0


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its descendants (Linux /proc)."""
    total_kb = 0
    for child in _descendants(pid) | {pid}:
        try:
            for line in Path(f"/proc/{child}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue
    return total_kb / 1024


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _start_worker(url: str, side: Side) -> None:
    env = {
        **os.environ,
        "DEMO_REDIS_URL": url,
        "DEMO_NAMESPACE": side.namespace,
        "DEMO_PARK": "1" if side.park else "0",
    }
    side.process = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", f"{__package__}.dramatiq_app:broker", "--processes", "1", "--threads", "4"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop_worker(side: Side) -> None:
    if side.process is not None and side.process.poll() is None:
        os.killpg(side.process.pid, signal.SIGTERM)
        try:
            side.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(side.process.pid, signal.SIGKILL)
            side.process.wait(5)


def _collect(client: redis.Redis, side: Side) -> None:
    for raw in client.lrange(results_key(side.namespace), 0, -1):
        n, due_ms, ran_ms = json.loads(raw)
        side.runs[int(n)] += 1
        side.lateness_ms.append(float(ran_ms) - float(due_ms))


def run_dramatiq_demo(
    url: str,
    *,
    messages: int,
    send_seconds: float,
    min_delay: float,
    max_delay: float,
    progress: Callable[[dict[str, int]], None] | None = None,
) -> DramatiqDemoReport:
    """Send ``messages`` delayed messages (``min_delay``..``max_delay`` seconds, all above the threshold) over
    ``send_seconds`` to a worker with delay_broker and to a plain Dramatiq worker; wait until they ran."""
    client = redis.Redis.from_url(url)
    tag = uuid.uuid4().hex[:6]
    ours = Side("delay_broker", f"demo-{tag}-parked", park=True)
    plain = Side("plain Dramatiq", f"demo-{tag}-plain", park=False)
    started = time.monotonic()
    try:
        for side in (ours, plain):
            _start_worker(url, side)
        deadline = time.monotonic() + 60
        while not all(client.exists(boot_key(side.namespace)) for side in (ours, plain)):
            if time.monotonic() > deadline or any(s.process and s.process.poll() is not None for s in (ours, plain)):
                raise RuntimeError("a demo worker did not start (is dramatiq installed?)")
            time.sleep(0.1)
        time.sleep(1.0)  # let boot-time allocations settle before the baseline
        for side in (ours, plain):
            assert side.process is not None
            side.baseline_mb = side.peak_mb = tree_rss_mb(side.process.pid)
        senders = {side.namespace: build(url, side.namespace, park=side.park)[1] for side in (ours, plain)}
        store = DelayStore(client, namespace=ours.namespace)
        pace = send_seconds / max(messages, 1)
        last_due = 0.0
        for n in range(messages):
            delay = random.uniform(min_delay, max_delay)
            due_ms = time.time() * 1000 + delay * 1000
            last_due = max(last_due, due_ms)
            for actor in senders.values():
                actor.send_with_options(args=(n, int(due_ms)), delay=int(delay * 1000))
            if n % 100 == 0:
                _sample(ours, plain, client, store, progress, sent=n + 1)
                time.sleep(max(0.0, pace * 100 - 0.001))
        finish_by = last_due / 1000 + 30
        while time.time() < finish_by:
            counts = _sample(ours, plain, client, store, progress, sent=messages)
            if counts["executed"] >= messages and counts["plain executed"] >= messages:
                break
            time.sleep(0.2)
        time.sleep(1.0)  # a duplicate would show up right after the last run
    finally:
        for side in (ours, plain):
            _stop_worker(side)
    for side in (ours, plain):
        _collect(client, side)
    _remove_demo_keys(client, ours, plain)
    return DramatiqDemoReport(messages, ours, plain, time.monotonic() - started)


def _remove_demo_keys(client: redis.Redis, *sides: Side) -> None:
    """Delete what the demo wrote: on a Redis given with --redis-url the keys would stay for good. The
    namespaces are this run's own, so every key under them is the demo's."""
    for side in sides:
        keys = list(client.scan_iter(match=f"{side.namespace}:*"))  # results, the RedisBroker's queues
        if side.park:
            keys += DelayStore(client, namespace=side.namespace).keys.all()
        client.delete(*keys)


def _sample(
    ours: Side,
    plain: Side,
    client: redis.Redis,
    store: DelayStore,
    progress: Callable[[dict[str, int]], None] | None,
    *,
    sent: int,
) -> dict[str, int]:
    for side in (ours, plain):
        if side.process is not None:
            side.peak_mb = max(side.peak_mb, tree_rss_mb(side.process.pid))
    counters = store.stats().counters
    counts = {
        "sent": sent,
        "parked": counters.get("parked", 0),
        "promoted": counters.get("promoted", 0),
        "executed": int(client.llen(results_key(ours.namespace))),
        "plain executed": int(client.llen(results_key(plain.namespace))),
    }
    if progress is not None:
        progress(counts)
    return counts
