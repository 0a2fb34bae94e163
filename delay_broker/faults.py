"""A promoter's faults: what is said of them (once per run of failures, not at every retry) and how long it
backs off.

A run of failures ends with a cycle that went through and in which Redis answered. A cycle that raised
nothing is not enough: one with no shard due for a look asks Redis nothing, and taking it for a recovery made
a promoter in an outage forget its backoff and retry, and say "reachable again", ten times a second.
"""

from __future__ import annotations

import logging

from .backoff import Backoff
from .errors import ConfigurationError, DelayBrokerError, StoreError, TargetUnavailable

logger = logging.getLogger("delay_broker.promoter")


class Faults:
    """The failures in a row of one promoter's loop, and of each of its shards apart.

    The methods that take a failure log what its run needs and return how long to wait (seconds); the
    promoter counts the failure and waits.

    Parameters:
      promoter_id: the promoter's id, for the log.
    """

    def __init__(self, promoter_id: str) -> None:
        self.id = promoter_id
        self.backoff = Backoff()
        """Of the whole loop: every shard failed, the target broker is down, a bug, a configuration refused."""
        self._redis_down = False
        self._outage_ended = False
        """Redis answered after an outage, and no cycle has gone through since: "reachable again" was said."""
        self._shards: dict[int, Backoff] = {}
        """Of each shard that failed while others did not."""

    def failed(self, doing: str, error: Exception) -> tuple[str, float]:
        """A cycle failed while ``doing`` (promoting, sleeping): the stage to count it under (``redis``,
        ``configuration``, ``target`` or ``internal``) and the wait. Call it in the ``except`` block: an
        unexpected error is logged with its traceback."""
        if isinstance(error, StoreError):
            return "redis", self._failed("redis", error)
        if isinstance(error, ConfigurationError):
            # A configuration that cannot work is not an outage: say so loudly, once per run of failures.
            if not self.backoff.failures:
                logger.error("Promoter %s cannot promote: %s", self.id, error)
            return "configuration", self._failed("configuration", error)
        if isinstance(error, TargetUnavailable):
            return "target", self._failed("target", error)
        return "internal", self.unexpected(doing)

    def unexpected(self, doing: str) -> float:
        """An error nobody foresaw (a bug, an unexpected reply) while ``doing``: it must not kill the promoter.
        Call it in the ``except`` block; the traceback is logged once per run of failures."""
        if not self.backoff.failures:
            logger.exception("Promoter %s: unexpected error while %s; retrying.", self.id, doing)
        else:
            logger.debug("Promoter %s: unexpected error while %s again.", self.id, doing, exc_info=True)
        return self._failed("internal", None)

    def _failed(self, stage: str, error: BaseException | None) -> float:
        self.backoff = self.backoff.failed()
        if stage == "redis" and not self._redis_down:
            self._redis_down = True
            logger.warning("Promoter %s: Redis unavailable (%s); backing off.", self.id, error)
        elif stage == "target" and self.backoff.failures == 1:
            logger.warning("Promoter %s: target broker unavailable (%s); backing off.", self.id, error)
        return self.backoff.wait()

    def shard_failed(self, shard: int, error: DelayBrokerError) -> float:
        """One shard failed while others were promoted: the wait before that shard alone is looked at again."""
        backoff = self._shards[shard] = self._shards.get(shard, Backoff()).failed()
        if backoff.failures == 1:
            logger.warning(
                "Promoter %s: shard %d unavailable (%s); promoting the other shards, retrying it with backoff.",
                self.id,
                shard,
                error,
            )
        return backoff.wait()

    def shard_answered(self, shard: int) -> None:
        """A shard was promoted: the end of its own failures, if it had any."""
        if self._shards.pop(shard, None) is not None:
            logger.info("Promoter %s: promoting shard %d again.", self.id, shard)

    def answered(self) -> None:
        """Redis answered a call: an outage is over, said at once (the run of failures goes on should the rest
        of the cycle fail)."""
        if self._redis_down:
            self._redis_down = False
            self._outage_ended = True
            logger.info("Promoter %s: Redis reachable again.", self.id)

    def recovered(self) -> None:
        """A cycle went through, and Redis answered in it: the run of failures is over."""
        self.answered()
        if self.backoff.failures and not self._outage_ended:
            logger.info("Promoter %s: promoting again after %d failed attempts.", self.id, self.backoff.failures)
        self._outage_ended = False
        self.backoff = self.backoff.reset()
