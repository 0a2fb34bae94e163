"""The delay store: parked messages in Redis and the atomic operations on them.

The store knows ids, due times and envelopes; it knows nothing of Dramatiq or Celery. Every operation is one
Lua script (see ``delay_broker/scripts``) on one shard, so each is atomic, touches one Redis Cluster slot and
costs one round trip. A namespace has one shard unless it was given more (``shards=N``, for Redis Cluster):
a message lives in the shard its id hashes to, recurring schedules and their occurrences in shard 0.

:class:`DelayStore` (``facade.py``) is the face; each of its operations is done by one part, and a part
knows only the parts below it:

- ``options.py``, ``replies.py``, ``encoding.py``: what a store is given, and what crosses its door;
- ``shards.py``: the client, the shards and their keys, the Redis clock, errors, waking promoters;
- ``replication.py``, ``runner.py``: durable writes, and running scripts (by id: where packed ids are);
- ``parking.py``, ``packs.py``, ``registry.py``, ``dead_letters.py``, ``promotion.py``, ``stats.py``: the
  operations in Redis;
- ``far_view.py``, ``reading.py``, ``sweeping.py``, ``tiers.py``: the far tier beside Redis, reads of both,
  and where a message lives (:class:`~.tiers.RedisOnly`, :class:`~.tiers.WithFarTier`);
- ``parts.py``, ``facade.py``: the parts wired together, and the face.
"""

from __future__ import annotations

import logging

from ..connect import CLIENT_DEFAULTS
from ..packing import DEFAULT_PACK_AFTER_MS
from ..records import (
    Claim,
    ClaimedMessage,
    DirectPromotion,
    MessageInfo,
    NackAction,
    OnConflict,
    ParkRequest,
    ParkResult,
    State,
    StoreStats,
)
from .facade import DelayStore
from .options import DEFAULT_MAX_PAYLOAD, STORE_OPTIONS, StoreOptions
from .packs import PACK_OPEN_CHUNK
from .promotion import MAX_AHEAD, ahead_to_ms, new_promoter_id
from .replies import MAX_BATCH, MAX_ID_LENGTH, ListState, check_id
from .runner import NEW_INDEX, PACK_CALLS
from .stats import LATENESS_EDGES_MS
from .sweeping import FAR_HOLD_BACK_SECONDS

logger = logging.getLogger("delay_broker.store")

__all__ = [
    "CLIENT_DEFAULTS",
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_PACK_AFTER_MS",
    "FAR_HOLD_BACK_SECONDS",
    "LATENESS_EDGES_MS",
    "MAX_AHEAD",
    "MAX_BATCH",
    "MAX_ID_LENGTH",
    "NEW_INDEX",
    "PACK_CALLS",
    "PACK_OPEN_CHUNK",
    "STORE_OPTIONS",
    "Claim",
    "ClaimedMessage",
    "DelayStore",
    "DirectPromotion",
    "ListState",
    "MessageInfo",
    "NackAction",
    "OnConflict",
    "ParkRequest",
    "ParkResult",
    "State",
    "StoreOptions",
    "StoreStats",
    "ahead_to_ms",
    "check_id",
    "new_promoter_id",
]
