"""Deliverers that need no framework: Redis lists, in the store's own Redis or in another one."""

from __future__ import annotations

from collections.abc import Mapping

import redis

from .connect import AnyRedis, is_cluster
from .errors import DeliveryRefused, TargetUnavailable
from .redis_errors import slot_moving
from .store import ClaimedMessage
from .targets import ListTarget

_TARGET_REFUSALS = (
    redis.exceptions.NoPermissionError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
)


class DirectLists:
    """Exactly-once promotion into lists of the store's own Redis (a :class:`~.promoter.DirectDeliverer`).

    ``DirectLists({"ready": ListTarget("jobs:ready")})`` moves messages parked with route ``"ready"`` into
    the list ``jobs:ready``, where a plain worker BRPOPs them.
    """

    def __init__(self, routes: Mapping[str, ListTarget]) -> None:
        self.routes = dict(routes)

    def direct_routes(self) -> Mapping[str, ListTarget]:
        return self.routes


class ListDeliverer:
    """At-least-once delivery into lists of any Redis (for instance one that is not the store's).

    Pushing and acknowledging are two steps, so a promoter that dies between them delivers the message
    again after its lease: consumers should tolerate the rare duplicate.
    """

    def __init__(self, client: AnyRedis, routes: Mapping[str, ListTarget]) -> None:
        self.client = client
        self.routes = dict(routes)

    def deliver(self, message: ClaimedMessage) -> None:
        assert message.envelope is not None
        envelope = message.envelope
        target = self.routes.get(envelope.route)
        if target is None:
            raise DeliveryRefused(f"unknown route {envelope.route!r}: not declared by the application")
        try:
            if target.mode == "hash":
                if envelope.hash_field is None:
                    raise DeliveryRefused(f"no hash field for route {envelope.route!r}")
                # Atomic on one server; on a Cluster the two keys are in different slots, and the payload
                # written first is harmless should the push fail (the message is delivered again).
                pipe = self.client.pipeline(transaction=not is_cluster(self.client))
                pipe.hset(target.hash_key, envelope.hash_field, envelope.payload)  # type: ignore[arg-type]
                pipe.rpush(target.list_key, envelope.hash_field)
                pipe.execute()
            elif target.mode == "rpush":
                self.client.rpush(target.list_key, envelope.payload)
            else:
                self.client.lpush(target.list_key, envelope.payload)
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise TargetUnavailable(str(error)) from error
        except (redis.ResponseError, redis.exceptions.ClusterError, AttributeError) as error:
            # A target key of the wrong type, a missing permission, a full or read-only server, a slot moving
            # between Cluster nodes: the target is unusable for every message, not this one, for now. Give the
            # batch back and back off (no attempt counted) rather than retry each message into the dead letters.
            moving = is_cluster(self.client) and slot_moving(error)
            if moving or str(error).startswith("WRONGTYPE") or isinstance(error, _TARGET_REFUSALS):
                raise TargetUnavailable(f"{target.list_key}: {type(error).__name__}: {error}") from error
            raise
