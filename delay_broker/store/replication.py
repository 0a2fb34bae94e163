"""Durable writes: a write followed by ``WAIT`` on its shard's master, and what the masters' replicas say."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from ..errors import DelayBrokerError, NotReplicated
from ..keys import Keyspace
from ..redis_errors import no_longer_master
from .shards import Shards

logger = logging.getLogger("delay_broker.store")


class Replication:
    """``WAIT`` for a shard's replicas, on the connection of the shard's master that made the write.

    Parameters:
      shards: the namespace's shards.
      replicas: replicas that must confirm each write (0: writes are not waited for).
      timeout_ms: how long to wait for them.
    """

    def __init__(self, shards: Shards, replicas: int, timeout_ms: int) -> None:
        self.shards = shards
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._present: dict[int, tuple[float, int]] = {}
        self._warned_unknown = False

    def shard_client(self, space: Keyspace) -> redis.Redis:
        """A client of the one server holding a shard: ``WAIT`` must follow the write on its connection."""
        client = self.shards.client
        if not self.shards.cluster:
            return client  # type: ignore[return-value]
        node = client.get_node_from_key(space.due)  # type: ignore[union-attr]
        return client.get_redis_connection(node)  # type: ignore[union-attr]

    def on_master(self, space: Keyspace, call: Callable[[redis.Redis], Any]) -> Any:
        """``call`` with a client of the shard's master. On a Cluster whose slot moved (failover, resharding)
        the slot map is read again and the call made once more: the per-node client cannot follow ``MOVED``."""
        cluster: Any = self.shards.client
        try:
            return call(self.shard_client(space))
        except (redis.exceptions.AskError, redis.ConnectionError, redis.TimeoutError) as error:
            if not self.shards.cluster or type(error) is redis.exceptions.AskError:
                # ASK: the slot is migrating and the map is right (it stays the old node's until the end). The
                # script was refused before it ran: the runner makes the call again until the slot has moved.
                raise
            cluster.nodes_manager.initialize()
            return call(self._moved_to(error) or self.shard_client(space))
        except redis.ResponseError as error:
            # The node the slot map named is a replica now (a clean CLUSTER FAILOVER leaves it up): nothing
            # redirects a WAIT, so the map is read again here. The write before the WAIT may have been made:
            # the caller gets an outage to back off from, not the same write made twice.
            if self.shards.cluster and no_longer_master(error):
                cluster.nodes_manager.initialize()
            raise

    def _moved_to(self, error: Exception) -> redis.Redis | None:
        """A client of the node a ``MOVED`` reply names. Right after a reshard the node asked for the slot map
        may not know of the move yet, and the map it gives sends the call back to the slot's old owner."""
        if not isinstance(error, redis.exceptions.MovedError):
            return None  # an ASK target serves only calls preceded by ASKING: the slot map's owner is asked
        cluster: Any = self.shards.client
        node = cluster.get_node(host=error.host, port=error.port)
        return None if node is None else cluster.get_redis_connection(node)

    def write(self, name: str, space: Keyspace, write: Callable[[Any], object], replicas: int | None = None) -> Any:
        """``write`` (into a pipeline) followed by ``WAIT`` for ``replicas`` (by default the store's) on the same
        connection to the shard's master; :class:`NotReplicated` when fewer confirm it in time."""
        needed = self.replicas if replicas is None else replicas

        def write_and_wait(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            write(pipe)
            pipe.wait(needed, self.timeout_ms)
            return pipe.execute()

        reply, confirmed = self.on_master(space, write_and_wait)
        if int(confirmed) < needed:
            raise NotReplicated(
                f"{name} was written on the master but confirmed by {confirmed} of {needed} replica(s) "
                f"within {self.timeout_ms} ms: not reported as done (a failover now could lose it); "
                "doing it again is safe"
            )
        return reply

    def set(self, space: Keyspace, key: str, value: bytes, ttl_ms: int) -> None:
        """``SET key value PX ttl_ms`` on the shard's master, confirmed like every write (a record the store keeps
        beside its messages, such as an execution's)."""
        self.write("the record", space, lambda pipe: pipe.set(key, value, px=ttl_ms))

    def require(self, shard: int, doing: str) -> None:
        """Refuse to start ``doing`` on a master that has fewer in-sync replicas than ``replicas``."""
        if not self.replicas:
            return
        space = self.shards.spaces[shard]
        with self.shards.calling(doing):
            confirmed = int(self.on_master(space, lambda client: client.wait(self.replicas, self.timeout_ms)))
        if confirmed < self.replicas:
            raise NotReplicated(
                f"not {doing}: the master has {confirmed} of {self.replicas} in-sync replica(s) (a failover may be "
                "under way); backing off"
            )

    def present(self, shard: int) -> int:
        """1 if the shard's master has a replica, else 0 (looked up at most once a second); 0 also when the
        state cannot be read (no permission, or a server or proxy without ``WAIT`` or ``INFO``), said once."""
        known = self._present.get(shard)
        if known is not None and known[0] > time.monotonic():
            return known[1]

        def look(client: redis.Redis) -> int:
            pipe = client.pipeline(transaction=False)
            pipe.wait(0, 0)  # answers at once; refused under an ACL without +wait, which a confirmed write needs
            pipe.info("replication")
            return 1 if int(pipe.execute()[1].get("connected_slaves", 0)) > 0 else 0

        try:
            with self.shards.calling("reading the replication state"):
                replicas = int(self.on_master(self.shards.spaces[shard], look))
        except DelayBrokerError as error:
            cause = error.__cause__
            unknown = isinstance(cause, redis.exceptions.ResponseError) and "unknown command" in str(cause).lower()
            if not (isinstance(cause, redis.exceptions.NoPermissionError) or unknown):
                raise
            if not self._warned_unknown:
                self._warned_unknown = True
                logger.warning(
                    "Store %r: cannot read the master's replication state or wait for it (%s); far rows moved into "
                    "Redis are not confirmed by a replica before they are deleted. Allow +info and +wait, or set "
                    "replicas=1.",
                    self.shards.keys.namespace,
                    error,
                )
            replicas = 0
        self._present[shard] = (time.monotonic() + 1.0, replicas)
        return replicas
