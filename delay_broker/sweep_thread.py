"""The far tier's sweeper: a thread beside a promoter's loop that moves rows coming due from PostgreSQL into
Redis. A sweep takes milliseconds (a PostgreSQL transaction and a script), which must not delay the promotion
of what is due meanwhile."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from .errors import StoreError
from .stop_flag import StopFlag
from .store import DelayStore

logger = logging.getLogger("delay_broker.promoter")

FAR_BATCHES_PER_SWEEP = 20
"""Far-tier move transactions per sweep at most: a backlog of rows is drained over several sweeps, so that a
stop request waits for no more than this many."""

ORPHAN_CHECK_INTERVAL = 300.0
"""Seconds between two looks for moved-in tokens whose rows are gone (left by a mover that died)."""


class SweepThread:
    """Sweeps the store's far tier every ``sweep_interval`` until ``stopping`` is set.

    Parameters:
      store: a store with a far tier.
      promoter_id: the promoter it works beside, for the log and the thread's name.
      stopping: the promoter's stop flag.
      unexpected: called (from within the ``except`` block) with what the sweeper was doing when an error
        nobody foresaw was raised; the promoter logs it and backs off.
    """

    def __init__(
        self, store: DelayStore, promoter_id: str, stopping: StopFlag, unexpected: Callable[[str], None]
    ) -> None:
        if store.far_tier is None:
            raise ValueError("the store has no far tier to sweep")
        self.store = store
        self.far_tier = store.far_tier
        self.id = promoter_id
        self._stopping = stopping
        self._unexpected = unexpected
        self._down = False
        self._thread = threading.Thread(target=self._run, name=f"delay-broker-sweeper-{promoter_id}", daemon=True)

    def start(self) -> SweepThread:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        orphans_checked = -math.inf  # at the first sweep too: a promoter that lives under 5 minutes still checks
        while not self._stopping.is_set():
            try:
                for _ in range(FAR_BATCHES_PER_SWEEP):
                    if self.store.sweep_far() < self.far_tier.batch or self._stopping.is_set():
                        break
                if time.monotonic() - orphans_checked >= ORPHAN_CHECK_INTERVAL:
                    orphans_checked = time.monotonic()
                    self.store.forget_moved_orphans()
                if self._down:
                    logger.info("Promoter %s: far tier sweep works again.", self.id)
                    self._down = False
            except StoreError as error:
                # PostgreSQL (or Redis) down: retried every interval; what is in Redis is promoted meanwhile.
                if not self._down:
                    logger.warning("Promoter %s: far tier sweep failed, retrying every interval: %s", self.id, error)
                self._down = True
            except Exception:
                self._unexpected("sweeping the far tier")
            self._stopping.wait(self.far_tier.sweep_interval)
