"""Keeping a claim's lease while its messages are being delivered.

A lease that runs out means, to every other promoter, that its holder died: they claim the messages again,
deliver them a second time, and count an attempt. A holder that is alive but slow (a RabbitMQ memory alarm
blocks publishers for minutes; an SQS reply can take longer than the lease) must therefore renew it: a
thread of the promoter does, every third of the lease, until the deliveries are over. A promoter that really
dies stops renewing, and its lease runs out as before.

One delivery that hangs (a publish with no timeout to a broker that stopped answering) must not hold the rest
of its batch for as long as it hangs: once a delivery has taken longer than the lease, the messages of the
batch not yet begun are given back (released: due again at once for any promoter, no attempt counted), and
only the others stay renewed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import DelayBrokerError

if TYPE_CHECKING:
    from .store import DelayStore

logger = logging.getLogger("delay_broker.promoter")


class LeaseRenewal:
    """Renews the lease of ``ids`` (one claim of one shard) in the background until :meth:`stop`."""

    def __init__(self, store: DelayStore, ids: Sequence[str], deadline_ms: int, lease: float, shard: int) -> None:
        self._store = store
        self._ids = list(ids)
        self._deadline_ms = deadline_ms
        self._lease = lease
        self._shard = shard
        self._renewed_at = time.monotonic()  # the claim itself, just made
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # the lease: its deadline (the token) changes with each renewal
        self._progress = threading.Lock()  # what the deliveries are at, apart: never held across a Redis call
        self._not_begun = set(self._ids)
        self._released: set[str] = set()
        self._delivering_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="delay-broker-lease", daemon=True)

    def start(self) -> LeaseRenewal:
        self._thread.start()
        return self

    def safe_until(self) -> float:
        """The monotonic time until which a delivery may start: a margin before the lease held for sure ends
        (past it, should renewals have failed, another promoter may take the messages again)."""
        return self._renewed_at + self._lease * 0.8

    def held_until(self) -> float:
        """The monotonic time until which the lease holds for sure (from the claim or its last renewal, with a
        margin for the clocks of Redis and this host), after which another promoter may take the messages."""
        return self._renewed_at + self._lease * 0.9

    def begin(self, id: str) -> bool:
        """Before delivering ``id``: False if it was given back meanwhile (it is not this promoter's any more)."""
        with self._progress:
            if id in self._released:
                return False
            self._not_begun.discard(id)
            self._delivering_since = time.monotonic()
            return True

    def done(self) -> None:
        """After a delivery, whatever its outcome."""
        with self._progress:
            self._delivering_since = None

    def was_released(self, id: str) -> bool:
        """Whether ``id`` was given back while a delivery before it hung."""
        with self._progress:
            return id in self._released

    def stop(self) -> int:
        """Stop renewing; returns the lease deadline to acknowledge with (it changes at every renewal)."""
        self._stopping.set()
        self._thread.join()
        with self._lock:
            return self._deadline_ms

    def _run(self) -> None:
        while not self._stopping.wait(self._lease / 3):
            with self._lock:
                self._release_if_hung()
                try:
                    started = time.monotonic()
                    with self._progress:
                        ids = [id for id in self._ids if id not in self._released]
                    self._deadline_ms, held = self._store.renew(self._deadline_ms, ids, self._lease, shard=self._shard)
                    self._renewed_at = started
                except DelayBrokerError as error:
                    # Tried again at the next third; if Redis stays away the lease runs out, as it would have.
                    logger.debug("Renewing a lease failed: %s", error)
                    continue
            if held == 0:
                return  # reclaimed by another promoter: nothing of ours left to renew

    def _release_if_hung(self) -> None:
        with self._progress:
            since = self._delivering_since
            if since is None or time.monotonic() - since <= self._lease or not self._not_begun:
                return
            waiting = sorted(self._not_begun)
            self._not_begun.clear()
            self._released.update(waiting)
        reason = "released: the delivery before it hung"
        try:
            self._store.nack(self._deadline_ms, [(id, reason, "release") for id in waiting], shard=self._shard)
        except DelayBrokerError as error:
            # Not renewed any more, so their lease runs out instead: later, and counted as an attempt.
            logger.debug("Releasing the rest of a batch failed: %s", error)
            return
        logger.warning(
            "A delivery has taken over %g s (the lease): %d message(s) of its batch not yet begun were given back "
            "for other promoters.",
            self._lease,
            len(waiting),
        )
