"""The ``delay-broker demo``: park a few thousand messages, promote them, and show that none is lost or
duplicated and how late they ran."""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from ..deliverers import DirectLists
from ..envelope import Envelope
from ..promoter import Promoter
from ..store import DelayStore, ParkRequest
from ..targets import ListTarget


@dataclass
class DemoReport:
    parked: int
    promoted: int
    received: int
    duplicates: int
    lost: int
    promotion_lateness_ms: list[int]
    end_to_end_lateness_ms: list[float]
    seconds: float

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("parked", str(self.parked)),
            ("promoted", str(self.promoted)),
            ("received by the worker", str(self.received)),
            ("duplicates", str(self.duplicates)),
            ("lost", str(self.lost)),
            *_percentile_rows("promotion lateness", self.promotion_lateness_ms),
            *_percentile_rows("end-to-end lateness", self.end_to_end_lateness_ms),
            ("wall time", f"{self.seconds:.1f} s"),
        ]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


def _percentile_rows(label: str, values: Sequence[float]) -> list[tuple[str, str]]:
    return [
        (f"{label} p50", f"{percentile(values, 0.5):.1f} ms"),
        (f"{label} p99", f"{percentile(values, 0.99):.1f} ms"),
        (f"{label} max", f"{max(values, default=0):.1f} ms"),
    ]


def run_list_demo(client: redis.Redis, *, messages: int, spread: float, promoters: int) -> DemoReport:
    """Park ``messages`` due at random over ``spread`` seconds, promote them into a ready list with
    ``promoters`` promoter threads, and pop them the way a plain worker would (BRPOP)."""
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    store = DelayStore(client, namespace=namespace)
    ready = store.keys.key("jobs:ready")
    deliverer = DirectLists({"ready": ListTarget(ready)})
    started = time.monotonic()
    due_by_id: dict[str, int] = {}
    requests = [
        ParkRequest(
            f"job-{n}",
            Envelope(route="ready", payload=f"job-{n}".encode()),
            delay=random.uniform(0.5, spread),
        )
        for n in range(messages)
    ]
    for result in store.park_many(requests):
        due_by_id[result.id] = result.due_ms
    running = [Promoter(store, deliverer, keep_lateness=True, max_idle=1.0).start() for _ in range(promoters)]
    seen: Counter[str] = Counter()
    lateness: list[float] = []
    deadline = time.monotonic() + spread + 10
    try:
        while sum(seen.values()) < messages and time.monotonic() < deadline:
            popped = client.brpop([ready], timeout=1)
            if popped is None:
                continue
            id = _text(popped[1])
            seen[id] += 1
            lateness.append(time.time() * 1000 - due_by_id[id])
        # Anything promoted twice would show up shortly after the last message; give it the chance.
        extra = client.brpop([ready], timeout=1)
        while extra is not None:
            seen[_text(extra[1])] += 1
            extra = client.brpop([ready], timeout=0.2)
    finally:
        for promoter in running:
            promoter.stop()
    client.delete(ready, *store.keys.all())
    return DemoReport(
        parked=len(due_by_id),
        promoted=sum(p.counters.promoted for p in running),
        received=len(seen),
        duplicates=sum(count - 1 for count in seen.values()),
        lost=len(set(due_by_id) - set(seen)),
        promotion_lateness_ms=[value for p in running for value in p.counters.lateness_ms],
        end_to_end_lateness_ms=lateness,
        seconds=time.monotonic() - started,
    )
