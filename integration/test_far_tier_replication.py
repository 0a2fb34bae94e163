"""Far rows moved into a replicated Redis: deleted from PostgreSQL only once a replica holds their copy.

A message parked far ahead was safe in PostgreSQL, often for weeks. Moved into a master that fails over before
its replica got the copy, it would be lost with the master's unreplicated writes, while its row was deleted: a
Sentinel failover during sweeps lost 169 of 600 such messages with the default ``replicas=0``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.errors import NotReplicated
from delay_broker.far import FarTier

from .ha_servers import StandaloneServer
from .servers import PostgresServer

HORIZON = 2.0


@pytest.fixture
def master_and_replica() -> Iterator[tuple[StandaloneServer, StandaloneServer]]:
    master, replica = StandaloneServer("far-master"), StandaloneServer("far-replica")
    try:
        replica.client().replicaof("127.0.0.1", master.node.port)
        deadline = time.monotonic() + 20
        while replica.client().info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.05)
        yield master, replica
    finally:
        replica.close()
        master.close()


def rows_left(postgres: PostgresServer, store: DelayStore) -> int:
    """The store's rows in PostgreSQL, retired ones too (``stats().far`` leaves those out)."""
    with psycopg.connect(postgres.url, autocommit=True) as connection:
        sql = "SELECT count(*) FROM delay_broker_far WHERE namespace = %s"
        return int(connection.execute(sql, (store._far.namespace,)).fetchone()[0])  # type: ignore[union-attr,index]


def test_a_move_a_replica_does_not_confirm_leaves_the_rows(
    master_and_replica: tuple[StandaloneServer, StandaloneServer], postgres: PostgresServer, unique: str
) -> None:
    master, replica = master_and_replica
    client = master.client()
    tier = FarTier(postgres.url, horizon=HORIZON, sweep_interval=0.1, lease=5.0)
    store = DelayStore(client, namespace=f"farrep-{unique}", far_tier=tier, replica_timeout=0.3)
    try:
        store.park_many([ParkRequest(f"m{n}", Envelope("ready", b"m"), delay=3) for n in range(5)])
        assert store.stats().far == 5
        time.sleep(1.2)  # due within the horizon now
        process = replica.node.process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)  # connected, but confirms nothing
        try:
            for _ in range(2):  # the second finds the copies the first left, and must not take them as confirmed
                with pytest.raises(NotReplicated):
                    store.sweep_far()
                assert rows_left(postgres, store) == 5, "the rows stay until a replica holds their copies"
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert store.sweep_far() == 5
        assert rows_left(postgres, store) == 0 and store.stats().parked == 5
        replica_client = replica.client()
        deadline = time.monotonic() + 10
        while replica_client.hlen(store.keys.msg) < 5:
            assert time.monotonic() < deadline, "the replica never got the copies"
            time.sleep(0.05)
    finally:
        client.delete(*client.scan_iter(match=store.keys.pattern))
        with psycopg.connect(postgres.url, autocommit=True) as connection:
            connection.execute("DELETE FROM delay_broker_far WHERE namespace = %s", (store._far.namespace,))  # type: ignore[union-attr]
        client.close()


def test_a_master_without_replicas_moves_at_once(postgres: PostgresServer, unique: str) -> None:
    master = StandaloneServer("far-alone")
    client: redis.Redis = master.client()
    tier = FarTier(postgres.url, horizon=HORIZON, sweep_interval=0.1, lease=5.0)
    store = DelayStore(client, namespace=f"faralone-{unique}", far_tier=tier, replica_timeout=5)
    try:
        store.park("m", Envelope("ready", b"m"), delay=3)
        time.sleep(1.2)
        assert store.sweep_far() == 1
        assert "cmdstat_wait" not in client.info("commandstats"), "no replica to wait for"
    finally:
        client.close()
        master.close()
