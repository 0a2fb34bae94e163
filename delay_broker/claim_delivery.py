"""The at-least-once delivery of one claim: each message handed to a deliverer under a lease kept renewed, then
the delivered ones acknowledged and the others given back (released, retried later, or dead-lettered).

A promoter that dies between a delivery and its acknowledgement delivers the message again once the lease
runs out; that is the "at least" of at-least-once. Everything else here keeps duplicates to that case.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from . import tracing
from .backoff import Backoff
from .errors import DeliveryRefused, StoreError, TargetUnavailable
from .renewal import LeaseRenewal
from .reports import PromoterCounters
from .stop_flag import StopFlag
from .store import Claim, ClaimedMessage, DelayStore, NackAction

logger = logging.getLogger("delay_broker.promoter")

T = TypeVar("T")


@runtime_checkable
class Deliverer(Protocol):
    """Puts one claimed message into its framework's queue (at-least-once, under a lease).

    Raise :class:`~delay_broker.errors.DeliveryRefused` for a message that can never be delivered (it is
    dead-lettered), :class:`~delay_broker.errors.TargetUnavailable` when the broker is down (the batch is
    given back and the promoter backs off), anything else for a failure worth retrying.
    """

    def deliver(self, message: ClaimedMessage) -> None: ...


@dataclass
class Deliveries:
    """What became of one claim's messages."""

    delivered: list[str] = field(default_factory=list)
    lateness: list[int] = field(default_factory=list)
    """Of each delivered message: ms past its due time."""
    by_task: Counter[tuple[str, str]] = field(default_factory=Counter)
    failures: list[tuple[str, str, NackAction]] = field(default_factory=list)
    """Id, reason and what to do of each message not delivered."""
    outage: TargetUnavailable | None = None
    """The target broker went away: the rest of the claim was given back."""
    dead: int = 0
    """Messages dead-lettered, by this delivery or by the claim itself (lease ran out too often, no envelope)."""


class ClaimDelivery:
    """Delivers one claim's messages one by one, then settles the claim with the store.

    Parameters:
      claim: what the promoter claimed (possibly no message: then only the claim's own dead letters count).
      deliverer: hands each message to its framework.
      store: the store the claim was made on.
      lease: the claim's lease, in seconds (renewed every third of it while deliveries go on).
      promoter_id: the claiming promoter, for the log.
      stopping: the promoter's stop flag: once set, no further delivery starts.
      counters: the promoter's totals (the messages given back for a retry are counted there).
    """

    def __init__(
        self,
        claim: Claim,
        deliverer: Deliverer,
        *,
        store: DelayStore,
        lease: float,
        promoter_id: str,
        stopping: StopFlag,
        counters: PromoterCounters,
    ) -> None:
        self.claim = claim
        self.deliverer = deliverer
        self.store = store
        self.lease = lease
        self.id = promoter_id
        self._stopping = stopping
        self._counters = counters
        self._renewal = LeaseRenewal(
            store, [message.id for message in claim.messages], claim.lease_deadline_ms, lease, claim.shard
        )

    def run(self) -> Deliveries:
        """Deliver, then acknowledge and give back; what became of the messages. A Redis failure while
        settling is raised (the messages left unsettled wait out their lease)."""
        claim, renewal = self.claim, self._renewal
        # The lease is renewed while the deliveries go on: a slow publish is not a dead promoter.
        if claim.messages:
            renewal.start()
        try:
            outcome = self._deliver_each()
        finally:
            deadline_ms = renewal.stop() if claim.messages else claim.lease_deadline_ms
        buried = list(claim.dead_lettered)  # by the claim itself: lease ran out too often, no envelope ...
        try:
            # Give back first: if Redis fails between the two calls, released messages must not wait out a
            # lease (its expiry counts as an attempt); delivered ones waiting out theirs are merely delivered
            # again.
            if outcome.failures:
                results: list[str] = self._while_leased(
                    lambda: self.store.nack(deadline_ms, outcome.failures, shard=claim.shard)
                )
                self._counters.retried += results.count("retried")
                buried += [
                    (id, reason)
                    for (id, reason, _), result in zip(outcome.failures, results, strict=True)
                    if result == "dead"
                ]
        finally:
            # Delivered is delivered: acknowledged even when giving the others back failed, or they would be
            # delivered again once their lease ran out.
            if outcome.delivered:
                self._while_leased(lambda: self.store.ack(deadline_ms, outcome.delivered, shard=claim.shard))
        for id, reason in buried:
            logger.warning("Promoter %s: dead-lettered %s: %s", self.id, id, reason)
        outcome.dead = len(buried)
        return outcome

    def _while_leased(self, settle: Callable[[], T]) -> T:
        """``settle`` (the ack or nack of the claim), tried again while its lease holds. Given up at once, a
        Redis blip (a slot in migration answering TRYAGAIN, a failover) made every delivered message of the
        batch run again once its lease ran out, and counted it an attempt: dead-lettered at max_attempts."""
        # No jitter: the pause must fit in the lease, and no other promoter settles this claim.
        backoff = Backoff(first=0.05, cap=1.0)
        last_try = False
        while True:
            try:
                return settle()
            except StoreError as error:
                backoff = backoff.failed()
                if last_try or time.monotonic() + backoff.ceiling >= self._renewal.held_until():
                    raise
                logger.debug("Promoter %s: settling a claim failed, trying again: %s", self.id, error)
                # A stop asked for meanwhile gets one more try, not the rest of the lease: stop() has a timeout.
                last_try = self._stopping.wait(backoff.ceiling)

    def _deliver_each(self) -> Deliveries:
        """Deliver the claim's messages one by one; what became of each."""
        claim, renewal = self.claim, self._renewal
        started = time.monotonic()
        done = Deliveries()
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
                done.lateness.append(claim.now_ms + claim.ahead_ms + elapsed_ms - message.due_ms)
            finally:
                renewal.done()
        return done


def _text(error: BaseException) -> str:
    """The error's text, with what UTF-8 cannot encode (a file name's undecodable bytes, say) escaped: it is
    logged and stored, and a log handler writing UTF-8 would fail on it."""
    return str(error).encode("utf-8", "backslashreplace").decode()
