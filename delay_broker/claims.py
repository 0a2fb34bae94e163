"""Short-lived claims on a token in a store's Redis: of all the processes that offer the same token, the first
one gets it and the others are told no.

For work that many processes are handed at once and only one should do: every Celery worker receives an
``inspect scheduled`` broadcast, and the one that claims the broadcast's ticket answers with the parked tasks.
A claim is one ``SET NX PX`` in shard 0 of the namespace; it expires by itself.
"""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

from .redis_errors import translate
from .store import MAX_ID_LENGTH, DelayStore


def claim(store: DelayStore, token: str, ttl: float) -> bool:
    """Claim ``token`` for ``ttl`` seconds: True for the first caller, False for every other one until it expires.

    Parameters:
      store: whose Redis and namespace hold the claim.
      token: what is claimed (a broadcast's ticket); at most :data:`~delay_broker.store.MAX_ID_LENGTH` characters.
      ttl: seconds the claim lasts: long enough that every process offering the token has offered it.

    Raises :class:`~delay_broker.errors.StoreUnavailable` (or another store error) when Redis cannot be asked.
    """
    if not isinstance(token, str) or not token or len(token) > MAX_ID_LENGTH:
        raise ValueError(f"token must be a non-empty string of at most {MAX_ID_LENGTH} characters, got {token!r}")
    if not ttl > 0:
        raise ValueError(f"ttl must be positive seconds, got {ttl!r}")
    try:
        return bool(store.client.set(store.keys.claim(token), b"1", nx=True, px=max(1, round(ttl * 1000))))
    except (redis.RedisError, RedisClusterException) as error:
        raise translate(error, "claiming a token") from error
