"""Riding through a Redis Cluster slot migration (``redis-cli --cluster reshard`` or ``rebalance``).

While a slot moves, key by key with ``MIGRATE``, Redis refuses a script whose keys are not all on the node asked
(``TRYAGAIN``, or ``ASK`` to the other node, which answers ``TRYAGAIN`` in turn): every script of the store is
given a key that never exists (:attr:`~delay_broker.keys.Keyspace.guard`), so each of them is refused for the whole
move, before it runs, and runs whole on one node before or after it. Once the slot has moved, ``MOVED`` sends
the call to its new node; redis-py follows it (a node's own client, used for ``WAIT``, does not). A call refused
so wrote nothing: it is made again, with backoff, until the slot has moved, for a bounded time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from ..errors import SlotMigrating
from ..redis_errors import slot_moving
from .shards import ClusterFailure

T = TypeVar("T")

MIGRATION_WAIT = 5.0
"""Seconds a store call waits for its shard's slot to finish moving before it raises :class:`SlotMigrating`: a
slot of a few small keys moves in milliseconds, one with a large pack (or under a small ``--cluster-pipeline``)
in seconds."""
BRIEF_WAIT = 0.0
"""The same for calls that have other work to do and a backoff of their own: a promoter's look at a shard (claim,
promotion, opening packs: the other shards go on, this one is looked at again after its backoff per shard), and
a best-effort split of the packed index. redis-py's own tries of a call on a Cluster client take some 0.4 s."""
FIRST_PAUSE = 0.01
LONGEST_PAUSE = 0.2


def waited_out(call: Callable[[], T], refused: BaseException, patience: float | None, doing: str) -> T:
    """``call`` made again, after a pause that doubles, while Redis refuses it because its slot is migrating (as
    it just did: ``refused``), for ``patience`` seconds at most (None: :data:`MIGRATION_WAIT`); then
    :class:`SlotMigrating`. Any other failure is raised as it comes (redis-py's)."""
    started = time.monotonic()
    deadline = started + (MIGRATION_WAIT if patience is None else patience)
    pause = FIRST_PAUSE
    last = refused
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, random.uniform(pause / 2, pause)))  # jittered: callers refused together spread out
        pause = min(2 * pause, LONGEST_PAUSE)
        try:
            return call()
        except ClusterFailure as error:
            if not slot_moving(error):
                raise
            last = error
    waited = time.monotonic() - started
    raise SlotMigrating(
        f"Redis Cluster refused {doing} for {waited:.1f} s: its slot is migrating between nodes (a reshard or "
        f"rebalance; last refusal: {_reply(last)}); nothing was done, doing it again is safe"
    ) from last


def _reply(error: BaseException) -> str:
    if isinstance(error, redis.exceptions.MovedError):
        return "MOVED"
    if isinstance(error, redis.exceptions.AskError):
        return "ASK"
    if isinstance(error, redis.exceptions.TryAgainError):
        return "TRYAGAIN"
    if isinstance(error, AttributeError):
        return "ASK to a master redis-py does not know yet"
    return "redirected or TRYAGAIN at each of redis-py's tries"


__all__ = ["BRIEF_WAIT", "MIGRATION_WAIT", "waited_out"]
