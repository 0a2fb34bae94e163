"""The store while a Redis Cluster slot of one of its shards migrates, stopped in the middle of the move (some keys
moved, some not), as ``redis-cli --cluster reshard``/``rebalance`` leave a slot for as long as its keys take:
calls wait for the move and are then made once on the new node, or give up saying so with nothing written, and
promoters go on with the other shards. (integration/test_store_rebalance.py runs a whole rebalance under load.)"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from click.testing import CliRunner
from redis.crc import key_slot

from delay_broker import DelayStore, Envelope, ListTarget, ParkRequest, Promoter, SlotMigrating
from delay_broker.cli import cli
from delay_broker.deliverers import ListDeliverer
from delay_broker.errors import NotReplicated
from delay_broker.far import FarTier
from delay_broker.store import migration
from tests.helpers import wait_for

from .cluster_moves import SlotMove

if TYPE_CHECKING:
    from .ha_servers import RedisClusterServers
    from .servers import PostgresServer

wait = functools.partial(wait_for, timeout=20.0, interval=0.05)

SHARDS = 3


@pytest.fixture
def namespace() -> str:
    return f"mig-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(redis_cluster: RedisClusterServers, namespace: str) -> Iterator[DelayStore]:
    store = DelayStore.from_url(redis_cluster.url, namespace=namespace, shards=SHARDS, retry_backoff=(0.05, 0.2))
    yield store
    store.client.close()


def ids_in(store: DelayStore, shard: int, count: int) -> list[str]:
    found = (str(uuid.uuid4()) for _ in range(100_000))
    return [id for id in found if store.shard_for(id) == shard][:count]


def envelope(payload: bytes = b"job") -> Envelope:
    return Envelope(route="ready", payload=payload)


def move_of(cluster: RedisClusterServers, store: DelayStore, shard: int, moved: int = 1) -> SlotMove:
    """The move of the shard's slot to the next master, begun, with ``moved`` of its keys moved already (one: the
    state in which the keys of a script of the shard are split between two nodes)."""
    key = store.shards[shard].due
    source = cluster.node_of_key(key)
    move = SlotMove(cluster, key_slot(key.encode()), source, (source + 1) % cluster.masters).begin()
    assert move.migrate(moved) == moved
    return move


def refusals(cluster: RedisClusterServers) -> dict[str, int]:
    """How many TRYAGAIN, ASK and MOVED replies the masters have given so far (``INFO errorstats``)."""
    counts = dict.fromkeys(("TRYAGAIN", "ASK", "MOVED"), 0)
    for index in range(cluster.masters):
        stats = cluster.nodes[index].client().info("errorstats")
        for code in counts:
            counts[code] += int(stats.get(f"errorstat_{code}", {}).get("count", 0))
    return counts


def in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            outcome["result"] = call()
        except Exception as error:
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_park_waits_for_the_move_and_is_made_once_on_the_new_node(
    redis_cluster: RedisClusterServers, store: DelayStore
) -> None:
    first, second = ids_in(store, 1, 2)
    store.park(first, envelope(), delay=3600)
    before = refusals(redis_cluster)
    move = move_of(redis_cluster, store, 1)
    thread, outcome = in_thread(lambda: store.park(second, envelope(b"second"), delay=3600))
    time.sleep(1.0)
    assert thread.is_alive(), f"the park waits while the slot moves: {outcome}"
    move.finish()
    thread.join(10)
    assert "error" not in outcome and outcome["result"].outcome == "new", outcome
    assert 1.0 <= outcome["seconds"] < migration.MIGRATION_WAIT
    assert refusals(redis_cluster)["TRYAGAIN"] > before["TRYAGAIN"], "it was refused while the keys were split"
    info = store.get(second)
    assert info is not None and info.raw.endswith(b"second")
    assert store.stats().counters["parked"] == 2, "parked once"


def test_a_durable_write_waits_for_the_move_on_the_master_s_own_connection(
    redis_cluster: RedisClusterServers, namespace: str
) -> None:
    # replicas=1 sends the script and WAIT through a client of the shard's master, which follows no redirect. This
    # cluster has no replicas: a write made ends in NotReplicated, one refused in SlotMigrating.
    store = DelayStore.from_url(redis_cluster.url, namespace=namespace, shards=SHARDS, replicas=1, replica_timeout=0.05)
    try:
        first, second = ids_in(store, 2, 2)
        with pytest.raises(NotReplicated):
            store.park(first, envelope(), delay=3600)
        move = move_of(redis_cluster, store, 2)
        thread, outcome = in_thread(lambda: store.park(second, envelope(), delay=3600))
        time.sleep(1.0)
        assert thread.is_alive(), outcome
        move.finish()
        thread.join(10)
        assert isinstance(outcome.get("error"), NotReplicated), outcome
        assert store.get(second) is not None, "made once the slot had moved"
    finally:
        store.client.close()


def test_a_call_refused_longer_than_it_waits_says_the_slot_is_migrating_and_wrote_nothing(
    redis_cluster: RedisClusterServers, store: DelayStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migration, "MIGRATION_WAIT", 0.5)
    first, second = ids_in(store, 0, 2)
    store.park(first, envelope(), delay=3600)
    move = move_of(redis_cluster, store, 0)
    try:
        with pytest.raises(SlotMigrating, match=r"slot is migrating between nodes.*nothing was done"):
            store.park(second, envelope(), delay=3600)
        with pytest.raises(SlotMigrating):
            store.cancel(first)
    finally:
        move.finish()
    assert store.get(second) is None and store.get(first) is not None
    counters = store.stats().counters
    assert counters["parked"] == 1 and counters.get("cancelled", 0) == 0


def test_a_script_whose_keys_are_all_present_is_refused_during_the_move_too(
    redis_cluster: RedisClusterServers, store: DelayStore
) -> None:
    """Redis lets a script with all its keys present run on the node the slot leaves, and a script that then
    touches a key it emptied itself fails there after its first writes. The store gives every script a key that is
    never written, so none runs until the slot has moved."""
    store.park_many([ParkRequest(str(uuid.uuid4()), envelope(), delay=3600) for _ in range(60)])
    space = store.shards[0]
    used = [space.packs, space.pack_live, space.stats]  # pack_audit's keys: all present here
    assert all(store.client.exists(key) for key in used)
    move = move_of(redis_cluster, store, 0, moved=0)
    try:
        with pytest.raises(SlotMigrating):
            store._runner.run("pack_audit", 0, [], migration_wait=0.0)
    finally:
        move.finish()
    assert store._runner.run("pack_audit", 0, []) == []


def test_promoters_go_on_with_the_other_shards_while_shard_0_s_slot_moves(
    redis_cluster: RedisClusterServers, store: DelayStore, namespace: str
) -> None:
    # Shard 0 holds the wake lists promoters block on: its move also refuses their BLPOP (two keys, split).
    target = ListTarget(f"{{{namespace}}}:ready")
    store.shard_for("")  # the layout recorded before the move
    promoter = Promoter(store, ListDeliverer(store.client, {"ready": target}), max_idle=1.0, lease=10).start()
    reader = redis_cluster.client()
    try:
        moving, others = ids_in(store, 0, 20), [*ids_in(store, 1, 20), *ids_in(store, 2, 20)]
        store.park_many([ParkRequest(id, envelope(id.encode()), delay=3600) for id in moving])
        move = move_of(redis_cluster, store, 0)
        try:
            store.park_many([ParkRequest(id, envelope(id.encode()), delay=0.5) for id in others])
            wait(lambda: reader.llen(target.list_key) == 40, what="the other shards' messages promoted meanwhile")
        finally:
            move.finish()
        store.reschedule(moving[0], delay=0)
        wait(lambda: reader.llen(target.list_key) == 41, what="shard 0 promoted again once its slot has moved")
        delivered = [item.decode() for item in reader.lrange(target.list_key, 0, -1)]
        assert sorted(delivered) == sorted([*others, moving[0]]), "each once"
    finally:
        promoter.stop()
        reader.delete(target.list_key)
    assert not promoter.running


def test_the_far_sweep_moves_the_other_shards_rows_while_one_shard_s_slot_moves(
    redis_cluster: RedisClusterServers, postgres: PostgresServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migration, "MIGRATION_WAIT", 0.3)
    tier = FarTier(postgres.url, horizon=2.0, sweep_interval=0.1, lease=5.0, batch=100)
    store = DelayStore.from_url(redis_cluster.url, namespace=f"farmig-{unique}", shards=SHARDS, far_tier=tier)
    table = store._tier.table.namespace  # type: ignore[attr-defined]
    try:
        ids = [f"m{n}" for n in range(60)]
        store.park_many([ParkRequest(id, envelope(id.encode()), delay=3) for id in ids])  # past the horizon
        moving = [id for id in ids if store.shard_for(id) == 1]
        store.park(ids_in(store, 1, 1)[0], envelope(), delay=1)  # a key of shard 1 in Redis, to move
        assert _rows(postgres, table) == 60
        move = move_of(redis_cluster, store, 1)
        try:
            time.sleep(1.2)  # every row within the horizon now
            moved = store.sweep_far()
            assert moved == 60 - len(moving) and _rows(postgres, table) == len(moving), "the other shards' rows"
        finally:
            move.finish()

        def all_moved() -> bool:
            store.sweep_far()  # the shard's rows are held back for a while, then moved
            return _rows(postgres, table) == 0

        wait_for(all_moved, 30, "the moved shard's rows moved in too")
        for id in ids:
            info = store.get(id)
            assert info is not None and info.raw.endswith(id.encode()), id
        assert store.stats().parked == 61, "each row moved in once"
    finally:
        store.client.close()
        with psycopg.connect(postgres.url, autocommit=True) as connection:
            connection.execute("DELETE FROM delay_broker_far WHERE namespace = %s", (table,))


def _rows(postgres: PostgresServer, namespace: str) -> int:
    with psycopg.connect(postgres.url, autocommit=True) as connection:
        row = connection.execute("SELECT count(*) FROM delay_broker_far WHERE namespace = %s", (namespace,)).fetchone()
        return int(row[0]) if row else 0


def test_the_cli_waits_for_the_move(redis_cluster: RedisClusterServers, store: DelayStore) -> None:
    store.park_many([ParkRequest(f"c-{n}", envelope(), delay=600) for n in range(30)])
    move = move_of(redis_cluster, store, 2)
    finisher = threading.Timer(1.0, move.finish)
    finisher.start()
    started = time.monotonic()
    base = ["--redis-url", redis_cluster.url, "--namespace", store.keys.namespace]
    stats = CliRunner().invoke(cli, ["stats", *base, "--json"])
    took = time.monotonic() - started
    finisher.join()
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output)["parked"] == 30 and took >= 0.9, "shard 2's count read once its slot had moved"
    listed = CliRunner().invoke(cli, ["ls", *base, "--json", "--limit", "30"])
    assert listed.exit_code == 0 and len(json.loads(listed.output)["messages"]) == 30, listed.output
