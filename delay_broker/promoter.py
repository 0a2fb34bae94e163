"""The promoter: the loop that hands due messages back to their framework's queue.

It knows nothing of Dramatiq or Celery: a *deliverer* does the handing over. Any number of promoters may
run at once, as threads or processes, on the same namespace; correctness never depends on there being one.

Beside this module: :mod:`~delay_broker.claim_delivery` (the at-least-once delivery of one claim, under the
lease :mod:`~delay_broker.renewal` keeps), :mod:`~delay_broker.faults` (what is said of failures, and the
backoff), :mod:`~delay_broker.sweep_thread` (the far tier's thread) and :mod:`~delay_broker.reports`
(counters and listeners).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from . import tracing
from .backoff import Backoff
from .claim_delivery import ClaimDelivery, Deliverer
from .errors import ConfigurationError, DelayBrokerError, SlotMigrating, StoreError
from .faults import Faults
from .reports import BasicListener, PromoterCounters, PromoterListener, as_listener
from .stop_flag import StopFlag
from .store import MAX_BATCH, DelayStore, ahead_to_ms, new_promoter_id
from .sweep_thread import FAR_BATCHES_PER_SWEEP, ORPHAN_CHECK_INTERVAL, SweepThread
from .targets import ListTarget

if TYPE_CHECKING:
    from .cron import CronScheduler

__all__ = [
    "BLOCKING_SLACK",
    "DEAD_TRIM_INTERVAL",
    "FAR_BATCHES_PER_SWEEP",
    "ORPHAN_CHECK_INTERVAL",
    "PACKS_AFTER_WAKE",
    "Deliverer",
    "DirectDeliverer",
    "Promoter",
    "PromoterCounters",
    "PromoterListener",
]

logger = logging.getLogger("delay_broker.promoter")

BLOCKING_SLACK = 0.12
"""Seconds before a due time at which a sleeping promoter stops blocking in Redis and sleeps locally."""

DEAD_TRIM_INTERVAL = 60.0
"""Seconds between two trims of every shard's dead letters by one promoter, when the store bounds their
retention (``dead_max_count``/``dead_max_age``): the age bound holds to within this. A shard is also trimmed
right after this promoter dead-lettered something there, so the count bound holds to within a batch."""

PACKS_AFTER_WAKE = 1.0
"""Seconds within which a woken promoter looks at the shard's packs: a wake may be for a pack that a producer
with a shorter ``pack_after`` made, due at least 5 seconds ahead."""


@runtime_checkable
class DirectDeliverer(Protocol):
    """Targets in the store's own Redis: promotion is one atomic script, exactly once, with no lease.

    ``direct_routes`` is asked on every cycle, so routes may be added while the promoter runs.
    """

    def direct_routes(self) -> Mapping[str, ListTarget]: ...


class Promoter:
    """Claims due messages, delivers them and acknowledges them, until stopped.

    On a sharded namespace it serves every shard: it looks at a shard when something there is due, when a
    park wakes it for that shard, and at least every ``max_idle`` seconds (which also takes over the
    shards of a promoter that died, within its lease). No leader: any number of promoters share the shards.

    Parameters:
      store: the delay store to promote from.
      deliverer: a :class:`DirectDeliverer` (exactly-once into the same Redis) or a :class:`Deliverer`.
      batch: messages per claim (<= 1000). A full batch is followed at once by the next (backlog drain).
      lease: seconds a claimed message stays reserved for this promoter before any other may take it.
      max_idle: longest sleep, in seconds, between two looks at the store when nothing is due sooner.
      listener: told what the promoter does, for metrics: a :class:`PromoterListener` (or an object with its
        ``promoted``, ``dead_lettered`` and ``failed`` methods). May be replaced while the promoter runs.
      keep_lateness: keep every lateness figure in :attr:`counters` (for demos and benchmarks).
      cron: recurring schedules whose next occurrences this promoter keeps parked (any number of promoters
        may share the same schedules; each occurrence still runs once).
      ahead: seconds (0 to 60) before its due time a message is promoted, for consumers that hold a message until
        its own due time anyway (a Celery task keeps its ``eta``): the worker receives it meanwhile and runs it
        when due, instead of starting to receive a whole batch then. 0 (the default): when due.
    """

    def __init__(
        self,
        store: DelayStore,
        deliverer: Deliverer | DirectDeliverer,
        *,
        batch: int = 200,
        lease: float = 30.0,
        max_idle: float = 5.0,
        listener: BasicListener | None = None,
        keep_lateness: bool = False,
        name: str | None = None,
        cron: CronScheduler | None = None,
        ahead: float = 0.0,
    ) -> None:
        if not isinstance(deliverer, DirectDeliverer | Deliverer):
            raise TypeError("deliverer must have a deliver(message) or a direct_routes() method")
        if not 1 <= batch <= MAX_BATCH or lease <= 0 or max_idle <= 0:
            raise ValueError(f"batch must be 1..{MAX_BATCH}, lease and max_idle positive")
        ahead_to_ms(ahead)  # refused here, not in the loop
        self.store = store
        self.deliverer = deliverer
        self.ahead = ahead
        self.batch = batch
        self.lease = lease
        self._eviction_checked = False
        self.max_idle = max_idle
        self._notify = PromoterListener()
        self.listener = listener
        self.cron = cron
        if cron is not None and cron.on_missed is None:
            cron.on_missed = self._schedule_missed
        self.id = name or new_promoter_id()
        self.counters = PromoterCounters(keep_lateness=keep_lateness)
        self._stopping = StopFlag()  # set by request_stop(), which a SIGTERM handler calls
        self._thread: threading.Thread | None = None
        self._faults = Faults(self.id)
        self._look_at: list[float] = []
        """Per shard: the monotonic time of the next look."""
        self._packs_at: list[float] = []
        """Per shard: the monotonic time of the next look at its packs (see :meth:`DelayStore.open_packs`)."""
        self._layout_checked = time.monotonic()
        self._dead_in: set[int] = set()
        """Shards this promoter dead-lettered something in since it last trimmed them."""
        self._trimmed_at = float("-inf")
        self._schedule_backoff = Backoff()
        """Of the recurring schedules' look, which backs off on its own."""
        self._schedules_retry_at = 0.0
        self._schedules_reported = False
        if isinstance(deliverer, DirectDeliverer):
            # A layout that cannot work (exactly-once on a Cluster, targets outside the slot) fails here, at
            # start-up, not in the loop (where it is checked again, should Redis be down now).
            with contextlib.suppress(StoreError):
                store.check_direct(deliverer.direct_routes())

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> Promoter:
        """Run in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("promoter already started")
        self._thread = threading.Thread(target=self.run, name=f"delay-broker-promoter-{self.id}", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the loop to stop after the batch in hand (safe from a signal handler)."""
        self._stopping.set()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Finish the batch in hand, give back what was not delivered, and return."""
        self._stopping.set()
        # If Redis is down the promoter is backing off, and the backoff waits on the stop event; a refused wake
        # (an ACL without the command) costs at most a sleep of max_idle, never the stop itself.
        with contextlib.suppress(DelayBrokerError):
            self.store.wake(self.id)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def listener(self) -> BasicListener | None:
        """The listener given (None: none)."""
        return self._listener

    @listener.setter
    def listener(self, listener: BasicListener | None) -> None:
        # Checked and wrapped once, here: the loop calls every method without looking it up.
        self._notify = as_listener(listener)
        self._listener = listener

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Promote until :meth:`stop` is called (blocks the calling thread)."""
        mode = "exactly-once" if isinstance(self.deliverer, DirectDeliverer) else "at-least-once"
        logger.info("Promoter %s started on %s (%s).", self.id, self.store.keys.pattern, mode)
        sweeper = None
        if self.store.far_tier is not None:
            sweeper = SweepThread(self.store, self.id, self._stopping, self._unexpected).start()
        try:
            while not self._stopping.is_set():
                self.step()
        finally:
            if sweeper is not None:
                sweeper.join(10)
            self.store.forget_promoter(self.id)
            logger.info("Promoter %s stopped.", self.id)

    def step(self) -> None:
        """One cycle: promote what is due, then sleep until the next due time (or back off after a fault).

        A run of failures ends with a cycle that went through and in which Redis answered (see
        :mod:`~delay_broker.faults`).
        """
        try:
            # Schedules first: an occurrence parked now and already due goes out in this same cycle.
            self._run_schedules()
            full, wait, answered = self._promote_once()
        except Exception as error:
            self._failed("promoting", error)
            return
        if answered:
            self._faults.answered()  # said now, not after the sleep
        self.counters.cycles += 1
        if self.cron is not None:
            wait = min(wait, max(self.cron.seconds_until_due(), self._schedules_retry_at - time.monotonic()))
        if not (full or wait <= 0 or self._stopping.is_set()):
            try:
                answered = self._sleep(wait) or answered
            except Exception as error:
                # The wake list can be refused too (a key of the wrong type, a missing permission): back off.
                self._failed("sleeping", error)
                return
        if answered:
            self._faults.recovered()

    def _run_schedules(self) -> None:
        """Keep the recurring schedules' next occurrences parked. Their failure (a stored definition or record
        nobody foresaw, a bug) is theirs alone: logged, retried with a backoff of its own, and the messages
        already parked are promoted meanwhile."""
        if self.cron is None or time.monotonic() < self._schedules_retry_at:
            return
        try:
            self.cron.run_pending()
        except Exception as error:
            self._schedule_backoff = self._schedule_backoff.failed()
            self._schedules_retry_at = time.monotonic() + self._schedule_backoff.wait()
            if isinstance(error, StoreError):
                # Redis itself: the promotion that follows meets it too, and reports and backs off from it.
                logger.debug("Promoter %s: recurring schedules not looked at: %s", self.id, error)
                return
            self.counters.errors += 1
            self._notify.failed("configuration" if isinstance(error, ConfigurationError) else "internal")
            # Once per run of failures: one that repeats at every backoff would flood the log.
            if self._schedules_reported:
                logger.debug("Promoter %s: recurring schedules failed again.", self.id, exc_info=True)
            elif isinstance(error, DelayBrokerError):
                logger.error(
                    "Promoter %s: recurring schedules failed, retrying; promoting meanwhile: %s", self.id, error
                )
            else:
                logger.exception("Promoter %s: recurring schedules failed, retrying; promoting meanwhile.", self.id)
            self._schedules_reported = True
            return
        if self._schedules_reported:
            logger.info("Promoter %s: recurring schedules run again.", self.id)
        self._schedules_reported = False
        self._schedule_backoff = self._schedule_backoff.reset()
        self._schedules_retry_at = 0.0

    def _sleep(self, wait: float) -> bool:
        """Sleep until something is due, waking at once when an earlier message is parked; whether Redis
        answered (a wait too short to block in Redis is slept locally).

        Redis checks blocking timeouts only ``hz`` times a second (100 ms apart by default), so a BLPOP
        alone would wake up to 100 ms late. The promoter blocks until shortly before the due time and
        sleeps the rest locally, which is precise.
        """
        if wait >= self.max_idle:
            self._woken(self.store.wait_for_wake(self.max_idle, self.id))
            return True
        wake_at = time.monotonic() + wait
        answered = False
        # In turns: the store shortens a BLPOP to fit the client's socket timeout, and a local sleep in its place
        # would not hear a park due earlier (a 2 s socket timeout made such parks up to 3.7 s late).
        while (left := wake_at - time.monotonic()) > BLOCKING_SLACK + 0.02 and not self._stopping.is_set():
            woken = self._woken(self.store.wait_for_wake(left - BLOCKING_SLACK, self.id))
            answered = True
            if woken:
                return True
        self._stopping.wait(max(0.0, wake_at - time.monotonic()))
        return answered

    def _woken(self, shards: frozenset[int] | None) -> bool:
        for shard in shards or ():
            if shard < len(self._look_at):
                self._look_at[shard] = 0.0
                # Or an earlier pack (one a producer with a shorter pack_after made, at least 5 s ahead): looked
                # at within a second, not at every wake (a look per park under load delayed promotion).
                self._packs_at[shard] = min(self._packs_at[shard], time.monotonic() + PACKS_AFTER_WAKE)
        return shards is not None

    # -- one cycle -------------------------------------------------------------------------------------

    def _warn_of_eviction(self) -> None:
        """Once per run, when Redis first answers (it may be away when the promoter starts: that is an outage
        to back off from, not a reason to stop)."""
        for server, policy in self.store.eviction_policies().items():
            logger.warning(
                "Promoter %s: Redis %s may evict keys (maxmemory-policy %s): once full it deletes parked messages "
                "without a trace. Set maxmemory-policy noeviction for the delay store.",
                self.id,
                server,
                policy,
            )
        self._eviction_checked = True

    def _promote_once(self) -> tuple[bool, float, bool]:
        """Promotes on every shard that needs a look; returns whether a batch was full, how long (s) until the
        next look, and whether Redis answered (with no shard due for a look, it was asked nothing)."""
        if not self._eviction_checked:
            self._warn_of_eviction()
        started = time.monotonic()
        if started - self._layout_checked >= self.max_idle:
            self._layout_checked = started
            self.store.refresh_layout()
        shards = len(self.store.shards)
        if len(self._look_at) != shards:
            self._look_at = [0.0] * shards
            self._packs_at = [0.0] * shards
        any_full, looked, failed = self._look_at_shards(started)
        if failed and len(failed) == looked and not all(isinstance(error, SlotMigrating) for _, error in failed):
            raise failed[0][1]  # nothing could be promoted: an outage, backed off as one
        # A shard whose slot is migrating waits by its own backoff even when it was the only one looked at: the
        # loop's backoff would hold up the other shards, which come due meanwhile.
        for shard, refusal in failed:
            # One shard failed while others were promoted: it alone is looked at again, after its own backoff.
            self._look_at[shard] = started + self._faults.shard_failed(shard, refusal)
            self.counters.errors += 1
            self._notify.failed("redis")
        answered = self._open_packs(started, {shard for shard, _ in failed}, answered=looked > len(failed))
        self._trim_dead(started)
        next_look = min(min(self._look_at), min(self._packs_at))
        return any_full, next_look - time.monotonic(), answered

    def _look_at_shards(self, started: float) -> tuple[bool, int, list[tuple[int, DelayBrokerError]]]:
        """Promotes on every shard due for a look; whether a batch was full, how many shards were looked at,
        and those that failed."""
        any_full = False
        failed: list[tuple[int, DelayBrokerError]] = []
        looked = 0
        for shard in range(len(self._look_at)):
            if self._look_at[shard] > started:
                continue
            looked += 1
            try:
                full, wait = self._promote_shard(shard)
            except DelayBrokerError as error:
                # One master of a Cluster down, failing over or short of replicas, or one shard's keys refused
                # (a key of the wrong type, an ACL): its shards wait, the others go on being promoted.
                if not (isinstance(error, StoreError) or type(error) is DelayBrokerError):
                    raise
                failed.append((shard, error))
                continue
            self._faults.shard_answered(shard)
            # Every shard is looked at within max_idle even when nothing is due: a wake lost with a producer
            # that died, or a lease left by a promoter that died, is picked up by the others.
            self._look_at[shard] = started + (0.0 if full else max(0.0, min(wait, self.max_idle)))
            any_full = any_full or full
        return any_full, looked, failed

    def _open_packs(self, now: float, failing: set[int], *, answered: bool) -> bool:
        """Open the packs coming due, one chunk per shard and cycle: a call blocks Redis for every promoter
        (about 35 µs a record), so what falls due meanwhile waits for one chunk at most, never a whole pack.
        A shard is looked at again when its next pack comes due, at once when a producer wakes promoters for
        an earlier pack, and at least every quarter of the lead: a pack is opened in time as long as it is
        opened within the lead.

        Returns whether Redis answered in this cycle (``answered``: the shards' looks did). When it answered
        nothing at all, a failure here is raised: an outage, backed off from as one."""
        unavailable: list[tuple[int, StoreError]] = []
        for shard, at in enumerate(self._packs_at):
            if at > now or shard in failing:
                continue
            try:
                self._open_packs_of(shard, now)
            except StoreError as error:
                unavailable.append((shard, error))
                continue
            except DelayBrokerError as error:
                if type(error) is not DelayBrokerError:
                    raise
                self._packs_failed(shard, error, now)  # one of the shard's keys refused: Redis answered that
            answered = True
        if unavailable and not answered:
            raise unavailable[0][1]
        for shard, failure in unavailable:
            self._packs_failed(shard, failure, now)
        return answered

    def _open_packs_of(self, shard: int, now: float) -> None:
        lead = self.store.pack_lead_ms / 1000
        next_ms = self.store.open_packs(shard, calls=1)
        wait = lead / 4 if next_ms is None else (next_ms - self.store.estimated_now_ms()) / 1000
        self._packs_at[shard] = now + max(0.0, min(wait, lead / 4))

    def _packs_failed(self, shard: int, error: DelayBrokerError, now: float) -> None:
        logger.warning("Promoter %s: opening packs of shard %d failed, retrying: %s", self.id, shard, error)
        self._packs_at[shard] = now + min(5.0, self.store.pack_lead_ms / 4000)

    def _trim_dead(self, now: float) -> None:
        """Enforce the store's dead-letter retention (see :meth:`DelayStore.trim_dead` for why here)."""
        if not self.store.trims_dead:
            return
        if now - self._trimmed_at >= DEAD_TRIM_INTERVAL:
            self._trimmed_at = now
            shards: list[int | None] = [None]
        else:
            shards = [*sorted(self._dead_in)]
        self._dead_in.clear()
        for shard in shards:
            dropped = self.store.trim_dead(shard)
            if dropped:
                logger.info(
                    "Promoter %s: dropped %d dead letter(s) past the store's retention (dead_max_count/dead_max_age).",
                    self.id,
                    dropped,
                )

    def _promote_shard(self, shard: int) -> tuple[bool, float]:
        """Returns whether the batch was full and how long (s) until something may be due in the shard."""
        if isinstance(self.deliverer, DirectDeliverer):
            started_ns = time.time_ns()
            # Each message's lateness only for whom uses it: reading it costs a score per message in the script.
            wanted = self.counters.keep_lateness or self._listener is not None
            routes = self.deliverer.direct_routes()
            result = self.store.promote_direct(
                routes, self.batch, self.id, shard=shard, lateness=wanted, ahead=self.ahead
            )
            if result.traced:
                tracing.record_promotions(result.traced, started_ns, time.time_ns())
            self._promoted(result.promoted, result.lateness_ms, result.dead_lettered, result.by_task)
            if result.dead_lettered:
                self._dead_in.add(shard)
                logger.warning(
                    "Promoter %s: dead-lettered %d message(s): unknown route or corrupt envelope (see: delay-broker "
                    "dead ls).",
                    self.id,
                    result.dead_lettered,
                )
            full = result.promoted + result.dead_lettered >= self.batch
            return full, _seconds_until(result.next_due_ms, result.now_ms, self.max_idle)
        claim = self.store.claim(self.batch, self.lease, self.id, shard=shard, ahead=self.ahead)
        done = ClaimDelivery(
            claim,
            self.deliverer,
            store=self.store,
            lease=self.lease,
            promoter_id=self.id,
            stopping=self._stopping,
            counters=self.counters,
        ).run()
        if done.dead:
            self._dead_in.add(shard)
        self._promoted(len(done.lateness), done.lateness, done.dead, done.by_task)
        if done.outage is not None:
            raise done.outage
        return len(claim.messages) >= self.batch, _seconds_until(claim.next_wake_ms, claim.now_ms, self.max_idle)

    def _promoted(self, count: int, lateness: Sequence[int], dead: int, by_task: Mapping[tuple[str, str], int]) -> None:
        if count:
            self.counters.record(count, lateness)
            self._notify.promoted(lateness)
            if by_task:
                self._notify.promoted_by_task(by_task)
        if dead:
            self.counters.dead_lettered += dead
            self._notify.dead_lettered(dead)

    def _schedule_missed(self, schedule: str, count: int) -> None:
        self.counters.missed += count
        self._notify.missed(schedule, count)

    # -- faults ----------------------------------------------------------------------------------------

    def _failed(self, doing: str, error: Exception) -> None:
        """A cycle failed while ``doing`` (promoting or sleeping): said as its kind needs, counted, backed off."""
        stage, wait = self._faults.failed(doing, error)
        self._count_and_wait(stage, wait)

    def _unexpected(self, doing: str) -> None:
        self._count_and_wait("internal", self._faults.unexpected(doing))

    def _count_and_wait(self, stage: str, wait: float) -> None:
        self.counters.errors += 1
        self._notify.failed(stage)
        self._stopping.wait(wait)


def _seconds_until(target_ms: int | None, now_ms: int, default: float) -> float:
    if target_ms is None:
        return default
    return (target_ms - now_ms) / 1000.0
