"""The far tier on replicated and clustered Redis: rows deleted only once a replica holds their copy, and a
Cluster master that is down holding up its own shards' rows only.

A message parked far ahead was safe in PostgreSQL, often for weeks. Moved into a master that fails over before
its replica got the copy, it would be lost with the master's unreplicated writes, while its row was deleted: a
Sentinel failover during sweeps lost 169 of 600 such messages with the default ``replicas=0``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis

from delay_broker import DelayStore, Envelope, ParkRequest
from delay_broker.errors import DelayBrokerError, NotReplicated
from delay_broker.far import FarTier
from tests.helpers import wait_for

from .ha_servers import RedisClusterServers, StandaloneServer
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
        return int(connection.execute(sql, (store._tier.table.namespace,)).fetchone()[0])  # type: ignore[union-attr,index]


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
            # The second, another process's sweeper (this one passes over those rows for a while), finds the
            # copies the first left: it must not take them as confirmed either.
            for sweeper in (store, DelayStore(client, namespace=store.keys.namespace, far_tier=tier)):
                with pytest.raises(NotReplicated):
                    sweeper.sweep_far()
                assert rows_left(postgres, store) == 5, "the rows stay until a replica holds their copies"
            assert store.sweep_far() == 0, "held back"
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert DelayStore(client, namespace=store.keys.namespace, far_tier=tier).sweep_far() == 5
        assert rows_left(postgres, store) == 0 and store.stats().parked == 5
        replica_client = replica.client()
        deadline = time.monotonic() + 10
        while replica_client.hlen(store.keys.msg) < 5:
            assert time.monotonic() < deadline, "the replica never got the copies"
            time.sleep(0.05)
    finally:
        client.delete(*client.scan_iter(match=store.keys.pattern))
        with psycopg.connect(postgres.url, autocommit=True) as connection:
            connection.execute("DELETE FROM delay_broker_far WHERE namespace = %s", (store._tier.table.namespace,))  # type: ignore[union-attr]
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
        waited = client.info("commandstats").get("cmdstat_wait", {"usec": 0})["usec"]
        assert waited < 1_000_000, "no replica to wait for: no WAIT blocked up to replica_timeout (5 s)"
    finally:
        client.close()
        master.close()


@pytest.mark.parametrize("failure", ["crash", "hang"])
def test_a_cluster_master_down_holds_up_the_far_rows_of_its_own_shards_only(
    postgres: PostgresServer, unique: str, failure: str
) -> None:
    """One transaction moved rows of every shard: a shard that refused rolled all back, and the next sweep took
    the same rows first again (17 of 187 rows of healthy shards moved in 15 s). A master that hangs costs socket
    timeouts instead, which ran whole batches out of their lease (24 of 59 healthy rows still stuck after 45 s):
    it is not tried again for a while, nor are shards begun past half the lease."""
    hang = failure == "hang"  # still a member to the others for a minute, so clients keep sending to it
    extra = {"node_timeout_ms": 60_000} if hang else {}
    with RedisClusterServers(extra_args=["--cluster-require-full-coverage", "no"], **extra) as cluster:
        # Short socket timeouts: every attempt on the hung master costs a few, and a loaded CI machine ran the
        # 60 s wait out with 2 s ones.
        options = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
        tier = FarTier(postgres.url, horizon=HORIZON, sweep_interval=0.1, lease=5.0, batch=10)
        store = DelayStore.from_url(cluster.url, namespace=f"farcl-{unique}", shards=6, far_tier=tier, **options)
        try:
            ids = [f"m{n}" for n in range(90)]
            store.park_many([ParkRequest(id, Envelope("ready", b"m"), delay=3) for id in ids])
            home = cluster.node_of_key(store.shards[0].due)
            down = next(node for node in range(3) if node != home)
            stranded = {id for id in ids if cluster.node_of_key(store.shards[store.shard_for(id)].due) == down}
            assert len(stranded) > tier.batch, "enough rows of the shards that go down to fill a batch"
            process = cluster.nodes[down].process
            assert process is not None
            if hang:
                os.kill(process.pid, signal.SIGSTOP)
            else:
                cluster.nodes[down].stop(crash=True)
            time.sleep(1.2)  # all due within the horizon

            def healthy_moved() -> bool:
                with contextlib.suppress(DelayBrokerError):  # one shard down in each: the sweeper retries too
                    store.sweep_far()
                return rows_left(postgres, store) == len(stranded)

            wait_for(healthy_moved, 120, "the healthy shards' rows moved")
            for id in set(ids) - stranded:
                info = store.get(id)
                assert info is not None and info.state == "due", id
        finally:
            if hang:
                os.kill(process.pid, signal.SIGCONT)
            store.client.close()
            with psycopg.connect(postgres.url, autocommit=True) as connection:
                connection.execute("DELETE FROM delay_broker_far WHERE namespace = %s", (store._tier.table.namespace,))  # type: ignore[union-attr]
