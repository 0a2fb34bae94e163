"""The checker: what ran, against what was sent and what the run did to the servers.

Every execution beyond a message's first is a duplicate, and each one gets a cause, or ``unexplained``:

- ``worker_kill``: an earlier execution ran in a process that was SIGKILLed within :data:`ACK_WINDOW_MS` after
  it, before this one. The framework re-ran a task whose worker died before acknowledging it: Dramatiq's and
  Celery's own at-least-once (late acks), not the hand-off's.
- ``broker_restart``: an earlier execution ran shortly before, or during, a crash of the lane's broker, and this
  one after it: the acknowledgement died with the broker, which then handed the task out again.
- ``promoter_kill`` (at-least-once lanes): the message was leased by a promoter when one was killed; the lease
  ran out and another promoter delivered it again. Bounded by one batch per kill.
- ``failover`` (at-least-once lanes): the store failed over around the first execution, and the acknowledgement
  of its delivery had not reached the replica yet.

``duplicated`` counts what the delay store's hand-off produced or nothing explains (``promoter_kill``,
``failover``, ``unexplained``); ``reruns`` counts the frameworks' own (``worker_kill``, ``broker_restart``).

An at-least-once lane run with effectively-once execution (``once``) allows no duplicate from a promoter kill:
the workers drop a second delivery of a promotion (the store's ``duplicates_dropped`` counter says how many they
dropped). It allows what the guarantee documents as run twice (docs/reliability.md, "The guarantee, exactly"):
copies of a delivery that ran while the store failed over, whose execution record the failover lost (the old
master's last writes) or the store could not take (the delivery ran unchecked). Those are ``failover`` when the
earlier run is within :data:`ONCE_FAILOVER_MARGIN_MS` of the failover, a batch per failover at most.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .common import Run

ACK_WINDOW_MS = 10_000
"""The longest a framework may take, busy, from a task body's end to its acknowledgement."""

RESTART_WINDOW_MS = 30_000
"""How long before a broker crash an execution may be whose acknowledgement the crash swallowed."""

FAILOVER_WINDOW_MS = 60_000
"""How long before a failover a delivery may be whose acknowledgement was not replicated yet."""

ONCE_FAILOVER_MARGIN_MS = 5_000
"""With effectively-once execution: how far from a failover (its start, or the set's health again) a run may be
whose record the failover lost or which ran unchecked. A worker whose connection still went to the old master finds
it read-only after the switch, and then runs promoted messages unchecked for a second (``RETRY_AFTER_S``)."""

STORE_CAUSES = ("promoter_kill", "failover", "unexplained")
FRAMEWORK_CAUSES = ("worker_kill", "broker_restart")


@dataclass(frozen=True)
class Kill:
    """A worker process group SIGKILLed (its promoter thread with it)."""

    lane: str
    at_ms: int
    pids: frozenset[int]
    leased: frozenset[str] = frozenset()
    """Ids leased by any promoter of the lane just after the kill (at-least-once lanes)."""


@dataclass(frozen=True)
class Outage:
    """A broker crash and restart, or a store failover: from ``start_ms`` until healthy again at ``end_ms``."""

    kind: str  # "restart" | "failover"
    server: str
    lanes: frozenset[str]
    start_ms: int
    end_ms: int


@dataclass
class LaneFigures:
    lane: str
    exactly_once: bool
    batch: int
    once: bool = False
    """Effectively-once execution on an at-least-once lane: second deliveries are dropped by the workers."""
    messages: int = 0
    executions: int = 0
    kills: int = 0
    restarts: int = 0
    failovers: int = 0
    lost: list[str] = field(default_factory=list)
    strangers: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    duplicates: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    lateness_ms: list[int] = field(default_factory=list)
    store: dict[str, int] = field(default_factory=dict)
    """The delay store at the end: what is left in it and its counters (``promoted`` moves with the message)."""
    duplicate_runs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """For each id the hand-off ran twice (a store cause), every run as (ran_ms, pid): to tell what happened."""
    lost_where: dict[str, str] = field(default_factory=dict)
    """For each lost id, where the store says it is ("handed off": it left the store by promotion)."""

    @property
    def duplicated(self) -> int:
        return sum(len(self.duplicates[cause]) for cause in STORE_CAUSES)

    @property
    def reruns(self) -> int:
        return sum(len(self.duplicates[cause]) for cause in FRAMEWORK_CAUSES)

    @property
    def duplicate_bound(self) -> int:
        """What the guarantee allows: none on the exactly-once hand-off; with effectively-once execution a batch per
        failover (copies of what ran while the store failed over); else a batch per kill or failover."""
        if self.exactly_once:
            return 0
        return self.batch * (self.failovers if self.once else self.kills + self.failovers)

    @property
    def dropped(self) -> int:
        """Second deliveries the workers dropped (effectively once), by the store's counter."""
        return self.store.get("counter_duplicates_dropped", 0)

    @property
    def guarantee(self) -> str:
        return "exactly-once" if self.exactly_once else "effectively-once" if self.once else "at-least-once"

    def percentile(self, fraction: float) -> int:
        if not self.lateness_ms:
            return 0
        ordered = sorted(self.lateness_ms)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    @property
    def lost_after_handoff(self) -> list[str]:
        """Lost ids the store no longer holds, having handed them off (its counters agree): the framework lost them
        on the way from its queue to the task body (see docs/reliability.md, kombu's fetch). Still a failure."""
        return [id for id in self.lost if self.lost_where.get(id, "").startswith("handed off")]

    def ok(self) -> bool:
        return (
            not self.lost
            and not self.early
            and not self.strangers
            # At least once allows a duplicate without a known cause (a lease can run out on a slow delivery too),
            # within the bound; every one is still named by id.
            and (not self.exactly_once or not self.duplicates["unexplained"])
            # Effectively once: a promoter kill's copy is always dropped; only a failover's record loss is allowed.
            and (not self.once or not (self.duplicates["promoter_kill"] or self.duplicates["unexplained"]))
            and self.duplicated <= self.duplicate_bound
        )

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.lane,
            "guarantee": self.guarantee,
            "messages": self.messages,
            "executions": self.executions,
            "kills": self.kills,
            "restarts": self.restarts,
            "failovers": self.failovers,
            "lost": len(self.lost),
            "lost_after_handoff": len(self.lost_after_handoff),
            "duplicated": self.duplicated,
            "duplicate_bound": self.duplicate_bound,
            "dropped": self.dropped,
            "reruns": self.reruns,
            "by_cause": {cause: len(ids) for cause, ids in self.duplicates.items() if ids},
            "early": len(self.early),
            "strangers": len(self.strangers),
            "store": self.store,
            "lost_where": dict(sorted(self.lost_where.items())[:50]),
            "lateness_ms": {
                "p50": self.percentile(0.50),
                "p99": self.percentile(0.99),
                "max": max(self.lateness_ms, default=0),
                "mean": round(statistics.fmean(self.lateness_ms), 1) if self.lateness_ms else 0,
            },
            "ids": {
                "lost": self.lost[:50],
                "early": self.early[:50],
                "strangers": self.strangers[:50],
                # Every duplicate by id, however many: at least once is judged on them.
                **{f"duplicated_{cause}": ids for cause, ids in self.duplicates.items() if ids},
            },
            "duplicate_runs": self.duplicate_runs,
            "ok": self.ok(),
        }


def cause_of(
    earlier: list[Run],
    later: Run,
    exactly_once: bool,
    kills: list[Kill],
    outages: list[Outage],
    once: bool = False,
) -> str:
    """Why ``later`` ran although ``earlier`` (the same message) had already run."""

    def around(kind: str, window_ms: int, after_ms: int = 0) -> bool:
        """An earlier run shortly before or during an outage of ``kind`` (or ``after_ms`` after it), and this one
        after it began."""
        return any(
            outage.kind == kind
            and outage.start_ms - window_ms <= run.ran_ms <= outage.end_ms + after_ms
            and later.ran_ms >= outage.start_ms
            for run in earlier
            for outage in outages
        )

    if any(
        run.pid in kill.pids and run.ran_ms <= kill.at_ms <= later.ran_ms and kill.at_ms - run.ran_ms <= ACK_WINDOW_MS
        for run in earlier
        for kill in kills
    ):
        return "worker_kill"
    if around("restart", RESTART_WINDOW_MS):
        return "broker_restart"
    if exactly_once:
        return "unexplained"
    # Effectively once: a promoter kill's copy is dropped while the first run's record is there, so the failover
    # that can take the record comes first, and only close to it.
    if once and around("failover", ONCE_FAILOVER_MARGIN_MS, ONCE_FAILOVER_MARGIN_MS):
        return "failover"
    if any(later.id in kill.leased for kill in kills):
        return "promoter_kill"
    if not once and around("failover", FAILOVER_WINDOW_MS):
        return "failover"
    return "unexplained"


def check_lane(
    lane: str,
    *,
    exactly_once: bool,
    batch: int,
    sent: Mapping[str, int],
    runs: Iterable[Run],
    kills: Iterable[Kill],
    outages: Iterable[Outage],
    once: bool = False,
) -> LaneFigures:
    """The figures of one target; ``sent`` maps each acknowledged id to its due time (ms)."""
    kills = [kill for kill in kills if kill.lane == lane]
    outages = [outage for outage in outages if lane in outage.lanes]
    figures = LaneFigures(lane, exactly_once, batch, once, messages=len(sent), kills=len(kills))
    figures.restarts = sum(1 for outage in outages if outage.kind == "restart")
    figures.failovers = sum(1 for outage in outages if outage.kind == "failover")
    by_id: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_id[run.id].append(run)
        figures.executions += 1
    for id, executions in by_id.items():
        if id not in sent:
            figures.strangers.append(id)
            continue
        executions.sort(key=lambda run: run.ran_ms)
        due = sent[id]
        if executions[0].ran_ms < due:
            figures.early.append(id)
        figures.lateness_ms.append(executions[0].ran_ms - due)
        for position in range(1, len(executions)):
            cause = cause_of(executions[:position], executions[position], exactly_once, kills, outages, once)
            figures.duplicates[cause].append(id)
            if cause in STORE_CAUSES:
                figures.duplicate_runs[id] = [(run.ran_ms, run.pid) for run in executions]
    figures.lost = sorted(set(sent) - set(by_id))
    return figures
