"""Keeping a claim's lease while its messages are being delivered.

A lease that runs out means, to every other promoter, that its holder died: they claim the messages again,
deliver them a second time, and count an attempt. A holder that is alive but slow (a RabbitMQ memory alarm
blocks publishers for minutes; an SQS reply can take longer than the lease) must therefore renew it: a
thread of the promoter does, every third of the lease, until the deliveries are over. A promoter that really
dies stops renewing, and its lease runs out as before.
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
        self._lock = threading.Lock()
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

    def stop(self) -> int:
        """Stop renewing; returns the lease deadline to acknowledge with (it changes at every renewal)."""
        self._stopping.set()
        self._thread.join()
        with self._lock:
            return self._deadline_ms

    def _run(self) -> None:
        while not self._stopping.wait(self._lease / 3):
            with self._lock:
                try:
                    started = time.monotonic()
                    self._deadline_ms, held = self._store.renew(
                        self._deadline_ms, self._ids, self._lease, shard=self._shard
                    )
                    self._renewed_at = started
                except DelayBrokerError as error:
                    # Tried again at the next third; if Redis stays away the lease runs out, as it would have.
                    logger.debug("Renewing a lease failed: %s", error)
                    continue
            if held == 0:
                return  # reclaimed by another promoter: nothing of ours left to renew
