"""Growing a private Redis Cluster (integration/ha_servers.py) while it serves: a master added and the slots
rebalanced with ``redis-cli --cluster``, as an operator does, or one slot moved step by step, as ``redis-cli``
moves each (``CLUSTER SETSLOT`` IMPORTING/MIGRATING, ``MIGRATE`` of its keys, ``SETSLOT NODE``), for tests that
need to stop in the middle of a move."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from tests.helpers import wait_for

from .ha_servers import HOST, RedisClusterServers, redis_cli_cluster


def add_master(cluster: RedisClusterServers, timeout: float = 60.0) -> int:
    """Start a node and join it as a master without slots (``redis-cli --cluster add-node``); its index, once every
    node knows it."""
    index = cluster.start_node()
    new, known = f"{HOST}:{cluster.ports[index]}", f"{HOST}:{cluster.ports[0]}"
    redis_cli_cluster(["add-node", new, known], timeout, cluster.directory / "cluster-add-node.log")
    wait_for(cluster._converged, timeout, "the cluster did not take the new master in")
    return index


@dataclass(frozen=True)
class Rebalanced:
    seconds: float
    """How long ``redis-cli --cluster rebalance`` ran."""
    output: str


def rebalance(cluster: RedisClusterServers, *, pipeline: int = 10, timeout: float = 600.0) -> Rebalanced:
    """``redis-cli --cluster rebalance --cluster-use-empty-masters --cluster-pipeline <pipeline>`` (keys per
    ``MIGRATE``), waited for, then the cluster's convergence (every master with slots)."""
    started = time.monotonic()
    output = ""
    for attempt in range(5):
        try:
            arguments = ["rebalance", f"{HOST}:{cluster.ports[0]}", "--cluster-use-empty-masters"]
            output = redis_cli_cluster(
                [*arguments, "--cluster-pipeline", str(pipeline)], timeout, cluster.directory / "rebalance.log"
            )
            break
        except RuntimeError as error:
            # redis-cli refuses to start while the nodes do not agree on the configuration yet (gossip after the
            # add-node takes a moment); a refusal to start moves nothing.
            if "fix your cluster problems" not in str(error) or attempt == 4:
                raise
            time.sleep(1.0)
    seconds = time.monotonic() - started
    cluster.masters = len(set(slot_owners(cluster).values()))
    wait_for(cluster._converged, 60.0, "the cluster did not converge after the rebalance")
    return Rebalanced(seconds, output)


def slot_owners(cluster: RedisClusterServers) -> dict[int, int]:
    """Slot -> index of the node serving it, as node 0 sees it."""
    client = cluster.nodes[0].client(socket_timeout=5)
    try:
        owners: dict[int, int] = {}
        for first, last, (_host, port, *_), *_ in client.execute_command("CLUSTER SLOTS"):
            for slot in range(int(first), int(last) + 1):
                owners[slot] = cluster.ports.index(int(port))
        return owners
    finally:
        client.close()


class SlotMove:
    """One slot moved from node ``source`` to node ``target`` in steps, as ``redis-cli --cluster reshard`` moves it:
    :meth:`begin`, :meth:`migrate` (some keys, or all), :meth:`finish`."""

    def __init__(self, cluster: RedisClusterServers, slot: int, source: int, target: int) -> None:
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target
        self.nodes = [cluster.node_client(index) for index in range(len(cluster.nodes))]
        self.ids = [node.execute_command("CLUSTER MYID") for node in self.nodes]

    def begin(self) -> SlotMove:
        self.nodes[self.target].execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", self.ids[self.source])
        self.nodes[self.source].execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", self.ids[self.target])
        return self

    def keys_left(self) -> list[bytes]:
        return list(self.nodes[self.source].execute_command("CLUSTER GETKEYSINSLOT", self.slot, 100_000))

    def migrate(self, count: int | None = None) -> int:
        """Move ``count`` keys of the slot (all when None), ``MIGRATE`` ``KEYS`` at a time; how many moved."""
        keys = self.keys_left()[:count]
        if keys:
            port = self.cluster.ports[self.target]
            self.nodes[self.source].execute_command("MIGRATE", HOST, port, "", 0, 60_000, "KEYS", *keys)
        return len(keys)

    def finish(self) -> None:
        """The rest of the keys moved, and every master told the slot is the target's now."""
        self.migrate()
        for index in (self.target, self.source):
            self.nodes[index].execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.ids[self.target])
        for index, node in enumerate(self.nodes):
            if index not in (self.target, self.source) and _is_master(node):
                node.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.ids[self.target])


def _is_master(node: redis.Redis) -> bool:
    role = node.execute_command("ROLE")
    name = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    return name == "master"
