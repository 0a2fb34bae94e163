"""The promoter: the loop that hands due messages back to their framework's queue.

It knows nothing of Dramatiq or Celery: a *deliverer* does the handing over. Any number of promoters may
run at once, as threads or processes, on the same namespace; correctness never depends on there being one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from . import tracing
from .backoff import Backoff
from .errors import ConfigurationError, DelayBrokerError, DeliveryRefused, StoreError, TargetUnavailable
from .renewal import LeaseRenewal
from .reports import BasicListener, PromoterCounters, PromoterListener, as_listener
from .stop_flag import StopFlag
from .store import MAX_BATCH, Claim, ClaimedMessage, DelayStore, NackAction, new_promoter_id
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

T = TypeVar("T")

BLOCKING_SLACK = 0.12
"""Seconds before a due time at which a sleeping promoter stops blocking in Redis and sleeps locally."""

DEAD_TRIM_INTERVAL = 60.0
"""Seconds between two trims of every shard's dead letters by one promoter, when the store bounds their
retention (``dead_max_count``/``dead_max_age``): the age bound holds to within this. A shard is also trimmed
right after this promoter dead-lettered something there, so the count bound holds to within a batch."""

FAR_BATCHES_PER_SWEEP = 20
"""Far-tier move transactions per sweep at most: a backlog of rows is drained over several sweeps, so that a
stop request waits for no more than this many."""

ORPHAN_CHECK_INTERVAL = 300.0
"""Seconds between two looks for moved-in tokens whose rows are gone (left by a mover that died)."""

PACKS_AFTER_WAKE = 1.0
"""Seconds within which a woken promoter looks at the shard's packs: a wake may be for a pack that a producer
with a shorter ``pack_after`` made, due at least 5 seconds ahead."""


@runtime_checkable
class Deliverer(Protocol):
    """Puts one claimed message into its framework's queue (at-least-once, under a lease).

    Raise :class:`~delay_broker.errors.DeliveryRefused` for a message that can never be delivered (it is
    dead-lettered), :class:`~delay_broker.errors.TargetUnavailable` when the broker is down (the batch is
    given back and the promoter backs off), anything else for a failure worth retrying.
    """

    def deliver(self, message: ClaimedMessage) -> None: ...


@runtime_checkable
class DirectDeliverer(Protocol):
    """Targets in the store's own Redis: promotion is one atomic script, exactly once, with no lease.

    ``direct_routes`` is asked on every cycle, so routes may be added while the promoter runs.
    """

    def direct_routes(self) -> Mapping[str, ListTarget]: ...


@dataclass
class _Deliveries:
    """What became of one claim's messages."""

    delivered: list[str] = field(default_factory=list)
    lateness: list[int] = field(default_factory=list)
    by_task: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: list[tuple[str, str, NackAction]] = field(default_factory=list)
    outage: TargetUnavailable | None = None


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
    ) -> None:
        if not isinstance(deliverer, DirectDeliverer | Deliverer):
            raise TypeError("deliverer must have a deliver(message) or a direct_routes() method")
        if not 1 <= batch <= MAX_BATCH or lease <= 0 or max_idle <= 0:
            raise ValueError(f"batch must be 1..{MAX_BATCH}, lease and max_idle positive")
        self.store = store
        self.deliverer = deliverer
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
        self._redis_down = False
        self._outage_ended = False
        """Redis answered after an outage, and a cycle has yet to go through: "reachable again" was said."""
        self._backoff = Backoff()
        """Of the whole loop: every shard failed, the target broker is down, a bug, a configuration refused."""
        self._look_at: list[float] = []
        """Per shard: the monotonic time of the next look."""
        self._packs_at: list[float] = []
        """Per shard: the monotonic time of the next look at its packs (see :meth:`DelayStore.open_packs`)."""
        self._shard_backoff: dict[int, Backoff] = {}
        """Per shard that failed while others did not: its own backoff."""
        self._layout_checked = time.monotonic()
        self._dead_in: set[int] = set()
        """Shards this promoter dead-lettered something in since it last trimmed them."""
        self._trimmed_at = float("-inf")
        self._far_down = False
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
            sweeper = threading.Thread(target=self._sweep, name=f"delay-broker-sweeper-{self.id}", daemon=True)
            sweeper.start()
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

        A run of failures ends with a cycle that went through and in which Redis answered. A cycle with no
        shard due for a look asks Redis nothing: taken for a recovery, it made a promoter in an outage forget
        its backoff, and retry (and say "reachable again") ten times a second.
        """
        try:
            # Schedules first: an occurrence parked now and already due goes out in this same cycle.
            self._run_schedules()
            full, wait, answered = self._promote_once()
        except Exception as error:
            self._failed("promoting", error)
            return
        if answered:
            self._answered()  # said now, not after the sleep
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
            self._recovered()

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
            answered = True
            if self._woken(self.store.wait_for_wake(left - BLOCKING_SLACK, self.id)):
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
        any_full = False
        failed: list[tuple[int, DelayBrokerError]] = []
        looked = 0
        for shard in range(shards):
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
            if self._shard_backoff.pop(shard, None) is not None:
                logger.info("Promoter %s: promoting shard %d again.", self.id, shard)
            # Every shard is looked at within max_idle even when nothing is due: a wake lost with a producer
            # that died, or a lease left by a promoter that died, is picked up by the others.
            self._look_at[shard] = started + (0.0 if full else max(0.0, min(wait, self.max_idle)))
            any_full = any_full or full
        if failed and len(failed) == looked:
            raise failed[0][1]  # nothing could be promoted: an outage, backed off as one
        for shard, refusal in failed:
            self._shard_fault(shard, refusal, started)
        answered = self._open_packs(started, {shard for shard, _ in failed}, answered=looked > len(failed))
        self._trim_dead(started)
        next_look = min(min(self._look_at), min(self._packs_at))
        return any_full, next_look - time.monotonic(), answered

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

    def _sweep(self) -> None:
        """The far tier's sweeper, in a thread of its own beside the promotion loop: a sweep takes milliseconds
        (a PostgreSQL transaction and a script), which must not delay the promotion of what is due meanwhile."""
        assert self.store.far_tier is not None
        orphans_checked = -math.inf  # at the first sweep too: a promoter that lives under 5 minutes still checks
        while not self._stopping.is_set():
            try:
                for _ in range(FAR_BATCHES_PER_SWEEP):
                    if self.store.sweep_far() < self.store.far_tier.batch or self._stopping.is_set():
                        break
                if time.monotonic() - orphans_checked >= ORPHAN_CHECK_INTERVAL:
                    orphans_checked = time.monotonic()
                    self.store.forget_moved_orphans()
                if self._far_down:
                    logger.info("Promoter %s: far tier sweep works again.", self.id)
                    self._far_down = False
            except StoreError as error:
                # PostgreSQL (or Redis) down: retried every interval; what is in Redis is promoted meanwhile.
                if not self._far_down:
                    logger.warning("Promoter %s: far tier sweep failed, retrying every interval: %s", self.id, error)
                self._far_down = True
            except Exception:
                self._unexpected("sweeping the far tier")
            self._stopping.wait(self.store.far_tier.sweep_interval)

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
            result = self.store.promote_direct(self.deliverer.direct_routes(), self.batch, self.id, shard=shard)
            if result.traced:
                tracing.record_promotions(result.traced, started_ns, time.time_ns())
            self._promoted(result.lateness_ms, result.dead_lettered, result.by_task)
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
        claim = self.store.claim(self.batch, self.lease, self.id, shard=shard)
        self._deliver(claim)
        return len(claim.messages) >= self.batch, _seconds_until(claim.next_wake_ms, claim.now_ms, self.max_idle)

    def _deliver(self, claim: Claim) -> None:
        assert isinstance(self.deliverer, Deliverer)
        # The lease is renewed while the deliveries go on: a slow publish is not a dead promoter.
        renewal = LeaseRenewal(
            self.store, [message.id for message in claim.messages], claim.lease_deadline_ms, self.lease, claim.shard
        )
        if claim.messages:
            renewal.start()
        try:
            outcome = self._deliver_each(claim, renewal)
        finally:
            deadline_ms = renewal.stop() if claim.messages else claim.lease_deadline_ms
        buried = list(claim.dead_lettered)  # by the claim itself: lease ran out too often, no envelope ...
        try:
            # Give back first: if Redis fails between the two calls, released messages must not wait out a
            # lease (its expiry counts as an attempt); delivered ones waiting out theirs are merely delivered
            # again.
            if outcome.failures:
                outcomes: list[str] = self._while_leased(
                    renewal, lambda: self.store.nack(deadline_ms, outcome.failures, shard=claim.shard)
                )
                self.counters.retried += outcomes.count("retried")
                buried += [
                    (id, reason)
                    for (id, reason, _), result in zip(outcome.failures, outcomes, strict=True)
                    if result == "dead"
                ]
        finally:
            # Delivered is delivered: acknowledged even when giving the others back failed, or they would be
            # delivered again once their lease ran out.
            if outcome.delivered:
                self._while_leased(renewal, lambda: self.store.ack(deadline_ms, outcome.delivered, shard=claim.shard))
        for id, reason in buried:
            logger.warning("Promoter %s: dead-lettered %s: %s", self.id, id, reason)
        if buried:
            self._dead_in.add(claim.shard)
        self._promoted(outcome.lateness, len(buried), outcome.by_task)
        if outcome.outage is not None:
            raise outcome.outage

    def _while_leased(self, renewal: LeaseRenewal, settle: Callable[[], T]) -> T:
        """``settle`` (the ack or nack of a claim), tried again while its lease holds. Given up at once, a
        Redis blip (a slot in migration answering TRYAGAIN, a failover) made every delivered message of the
        batch run again once its lease ran out, and counted it an attempt: dead-lettered at max_attempts."""
        # No jitter: the pause must fit in the lease, and only this promoter settles this claim.
        backoff = Backoff(first=0.05, cap=1.0)
        last_try = False
        while True:
            try:
                return settle()
            except StoreError as error:
                backoff = backoff.failed()
                if last_try or time.monotonic() + backoff.ceiling >= renewal.held_until():
                    raise
                logger.debug("Promoter %s: settling a claim failed, trying again: %s", self.id, error)
                # A stop asked for meanwhile gets one more try, not the rest of the lease: stop() has a timeout.
                last_try = self._stopping.wait(backoff.ceiling)

    def _deliver_each(self, claim: Claim, renewal: LeaseRenewal) -> _Deliveries:
        """Deliver the claim's messages one by one; what became of each."""
        assert isinstance(self.deliverer, Deliverer)
        started = time.monotonic()
        done = _Deliveries()
        for message in claim.messages:
            if renewal.was_released(message.id):
                continue  # given back while a delivery before it hung: another promoter's now
            # Stop delivering while a safe margin of the lease is left (renewals move it on): past it another
            # promoter may take the message again, which would be a duplicate.
            if done.outage is not None or self._stopping.is_set() or time.monotonic() > renewal.safe_until():
                done.failures.append((message.id, "released: promoter stopping or out of lease", "release"))
                continue
            if message.envelope is None:
                done.failures.append((message.id, message.problem or "corrupt envelope", "dead"))
                continue
            if not renewal.begin(message.id):
                continue
            try:
                with tracing.promote_span(message.id, message.envelope.route, message.envelope.extra):
                    self.deliverer.deliver(message)
            except DeliveryRefused as error:
                done.failures.append((message.id, f"delivery refused: {_text(error)}", "dead"))
            except TargetUnavailable as error:
                done.outage = error
                done.failures.append((message.id, f"target unavailable: {_text(error)}", "release"))
            except Exception as error:
                # Type and text, not repr(): redis-py's exceptions leave their message out of repr().
                reason = f"delivery failed: {type(error).__name__}: {_text(error)}"
                logger.warning("Promoter %s: delivering %s failed: %s", self.id, message.id, reason)
                done.failures.append((message.id, reason, "retry"))
            else:
                done.delivered.append(message.id)
                done.by_task[message.envelope.route, message.envelope.name or ""] += 1
                elapsed_ms = int((time.monotonic() - started) * 1000)
                done.lateness.append(claim.now_ms + elapsed_ms - message.due_ms)
            finally:
                renewal.done()
        return done

    def _promoted(self, lateness: Sequence[int], dead: int, by_task: Mapping[tuple[str, str], int]) -> None:
        if lateness:
            self.counters.record(lateness)
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
        """A cycle failed while ``doing`` (promoting or sleeping): log it as its kind needs, and back off."""
        if isinstance(error, StoreError):
            self._fault("redis", error)
        elif isinstance(error, ConfigurationError):
            self._misconfigured(error)
        elif isinstance(error, TargetUnavailable):
            self._fault("target", error)
        else:
            # A bug or an unexpected reply must not kill the promoter; log it and keep going.
            self._unexpected(doing)

    def _fault(self, stage: str, error: BaseException | None) -> None:
        self.counters.errors += 1
        self._backoff = self._backoff.failed()
        self._notify.failed(stage)
        if stage == "redis" and not self._redis_down:
            self._redis_down = True
            logger.warning("Promoter %s: Redis unavailable (%s); backing off.", self.id, error)
        elif stage == "target" and self._backoff.failures == 1:
            logger.warning("Promoter %s: target broker unavailable (%s); backing off.", self.id, error)
        self._stopping.wait(self._backoff.wait())

    def _shard_fault(self, shard: int, error: DelayBrokerError, now: float) -> None:
        """One shard failed while others were promoted: it alone is looked at again after a backoff."""
        backoff = self._shard_backoff[shard] = self._shard_backoff.get(shard, Backoff()).failed()
        self.counters.errors += 1
        self._notify.failed("redis")
        if backoff.failures == 1:
            logger.warning(
                "Promoter %s: shard %d unavailable (%s); promoting the other shards, retrying it with backoff.",
                self.id,
                shard,
                error,
            )
        self._look_at[shard] = now + backoff.wait()

    def _misconfigured(self, error: ConfigurationError) -> None:
        # A configuration that cannot work is not an outage: say so loudly, once per run of failures.
        if not self._backoff.failures:
            logger.error("Promoter %s cannot promote: %s", self.id, error)
        self._fault("configuration", None)

    def _unexpected(self, doing: str) -> None:
        # The traceback once per run of failures: a fault that repeats at every backoff would flood the log.
        if not self._backoff.failures:
            logger.exception("Promoter %s: unexpected error while %s; retrying.", self.id, doing)
        else:
            logger.debug("Promoter %s: unexpected error while %s again.", self.id, doing, exc_info=True)
        self._fault("internal", None)

    def _answered(self) -> None:
        """Redis answered a call: an outage is over, and said so at once (the run of failures may go on, should
        the rest of the cycle fail)."""
        if self._redis_down:
            self._redis_down = False
            self._outage_ended = True
            logger.info("Promoter %s: Redis reachable again.", self.id)

    def _recovered(self) -> None:
        """A cycle went through, and Redis answered in it: the run of failures is over."""
        self._answered()
        if self._backoff.failures and not self._outage_ended:
            logger.info("Promoter %s: promoting again after %d failed attempts.", self.id, self._backoff.failures)
        self._outage_ended = False
        self._backoff = self._backoff.reset()


def _seconds_until(target_ms: int | None, now_ms: int, default: float) -> float:
    if target_ms is None:
        return default
    return (target_ms - now_ms) / 1000.0


def _text(error: BaseException) -> str:
    """The error's text, with what UTF-8 cannot encode (a file name's undecodable bytes, say) escaped: it is
    logged and stored, and a log handler writing UTF-8 would fail on it."""
    return str(error).encode("utf-8", "backslashreplace").decode()
