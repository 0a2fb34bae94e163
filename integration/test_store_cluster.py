"""The delay store on a real 3-master Redis Cluster: a sharded namespace spreads over every master, every store
operation and the CLI work across shards, promoters serve every shard, and what cannot work is refused."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from redis.crc import key_slot

from delay_broker import ConfigurationError, DelayStore, Envelope, ParkRequest
from delay_broker.cli import cli
from delay_broker.deliverers import DirectLists, ListDeliverer
from delay_broker.errors import NotReplicated, WrongNode
from delay_broker.promoter import Promoter
from delay_broker.targets import ListTarget
from tests.helpers import wait_for

if TYPE_CHECKING:
    from .ha_servers import RedisClusterServers

wait = functools.partial(wait_for, timeout=20.0, interval=0.05)

SHARDS = 6


@pytest.fixture
def namespace() -> str:
    return f"cl-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(redis_cluster: RedisClusterServers, namespace: str) -> Iterator[DelayStore]:
    store = DelayStore.from_url(redis_cluster.url, namespace=namespace, shards=SHARDS, retry_backoff=(0.05, 0.2))
    yield store
    for space in store.shards:  # only this test's keys
        for node in range(len(redis_cluster.ports)):
            client = redis_cluster.node_client(node)
            keys = list(client.scan_iter(match=space.pattern))
            for key in keys:
                client.delete(key)
            client.close()
    store.client.close()


def envelope(payload: bytes = b"job", route: str = "ready") -> Envelope:
    return Envelope(route=route, payload=payload)


def keys_per_node(cluster: RedisClusterServers, pattern: str) -> list[int]:
    counts = []
    for node in range(len(cluster.ports)):
        client = cluster.node_client(node)
        counts.append(sum(1 for _ in client.scan_iter(match=pattern)))
        client.close()
    return counts


def test_a_sharded_namespace_spreads_over_every_master(redis_cluster: RedisClusterServers, store: DelayStore) -> None:
    store.park_many([ParkRequest(f"m-{n}", envelope(), delay=3600) for n in range(600)])
    per_node = [
        sum(count) for count in zip(*(keys_per_node(redis_cluster, s.pattern) for s in store.shards), strict=True)
    ]
    assert len(per_node) == 3 and all(count > 0 for count in per_node), per_node
    slots = {key_slot(space.due.encode()) for space in store.shards}
    assert len(slots) == SHARDS
    parked_per_shard = [store.client.zcard(space.due) for space in store.shards]
    assert sum(parked_per_shard) == 600 and min(parked_per_shard) > 50, parked_per_shard
    assert store.stats().parked == 600


def test_every_store_operation_works_across_shards(store: DelayStore) -> None:
    ids = [f"op-{n}" for n in range(40)]
    for n, id in enumerate(ids):
        store.park(id, envelope(b"p%d" % n), delay=600 + n)
    assert {store.shard_for(id) for id in ids} == set(range(SHARDS)), "the ids cover every shard"
    assert store.get("op-7") is not None and store.get("op-7").raw.endswith(b"p7")  # type: ignore[union-attr]
    assert store.get("unknown") is None
    page = store.list_messages("due", count=10)
    assert [info.id for info in page] == ids[:10], "merged over shards in due order"
    assert [info.id for info in store.list_messages("due", offset=35, count=10)] == ids[35:]
    moved = store.reschedule("op-3", delay=7200)
    assert moved is not None and store.get("op-3").due_ms == moved  # type: ignore[union-attr]
    assert store.cancel("op-4") and not store.cancel("op-4")
    assert store.cancel_many(["op-5", "op-6", "nope"]) == 2
    stats = store.stats()
    assert stats.parked == 37 and stats.counters["parked"] == 40 and stats.counters["cancelled"] == 3
    assert sum(1 for _ in store.iter_all("due", page=7)) == 37


def test_promoters_serve_every_shard_and_wake_for_any_of_them(
    redis_cluster: RedisClusterServers, store: DelayStore, namespace: str
) -> None:
    target = f"{{{namespace}}}:ready"
    deliverer = ListDeliverer(store.client, {"ready": ListTarget(target)})
    # A long max_idle: only the per-shard wake-up can explain a prompt promotion.
    promoters = [Promoter(store, deliverer, max_idle=30.0).start() for _ in range(2)]
    try:
        time.sleep(0.5)  # both asleep
        sent = time.time()
        ids = [f"w-{n}" for n in range(60)]
        store.park_many([ParkRequest(id, envelope(id.encode()), delay=1.0) for id in ids])
        wait(lambda: store.client.llen(target) == 60, what="all 60 promoted")
        assert time.time() - sent < 10, "woken by the parks, not by max_idle"
        payloads = [item.decode() for item in store.client.lrange(target, 0, -1)]
        assert sorted(payloads) == sorted(ids), "each once"
        wait(lambda: store.stats().counters.get("promoted") == 60, what="acknowledged")
        assert store.stats().live_promoters >= 1
    finally:
        for promoter in promoters:
            promoter.stop()
        store.client.delete(target)
    assert not any(promoter.running for promoter in promoters), "stop() works on a cluster"


def test_the_hash_layout_deliverer_works_across_slots(store: DelayStore, namespace: str) -> None:
    # Dramatiq's RedisBroker layout: payload in <queue>.msgs, id pushed to <queue>; two slots on a cluster.
    queue = f"{namespace}:q"
    deliverer = ListDeliverer(store.client, {"q": ListTarget(queue, mode="hash", hash_key=f"{queue}.msgs")})
    store.park("h-1", Envelope(route="q", payload=b"body", hash_field="field-1"), delay=0)
    promoter = Promoter(store, deliverer, max_idle=1.0).start()
    try:
        wait(lambda: store.client.llen(queue) == 1, what="delivered")
    finally:
        promoter.stop()
    assert store.client.hget(f"{queue}.msgs", "field-1") == b"body" and promoter.counters.errors == 0
    store.client.delete(queue, f"{queue}.msgs")


def test_dead_letters_and_schedules_across_shards(store: DelayStore) -> None:
    store.park_many([ParkRequest(f"d-{n}", envelope(), delay=0) for n in range(20)])
    for shard in range(SHARDS):
        claim = store.claim(1000, 30, "p", shard=shard)
        store.nack(claim.lease_deadline_ms, [(m.id, "refused", "dead") for m in claim.messages], shard=shard)
    assert store.stats().dead == 20
    assert len(store.list_messages("dead", count=100)) == 20
    requeued = store.requeue_dead(["d-1", "d-2", "missing"])
    assert requeued.count == 2 and requeued.not_requeued == ["missing"]
    assert store.requeue_dead().count == 18
    for shard in range(SHARDS):
        claim = store.claim(1000, 30, "p", shard=shard)
        store.nack(claim.lease_deadline_ms, [(m.id, "refused", "dead") for m in claim.messages], shard=shard)
    assert store.purge_dead(["d-3"]) == 1 and store.purge_dead() == 19
    # A schedule's occurrences live beside its record in shard 0, and are found by id like any message.
    due = datetime.now(timezone.utc) + timedelta(hours=1)
    occurrence = "occurrence-of-report"
    assert store.park_occurrence("report", occurrence, envelope(), due).outcome == "new"
    assert store.park_occurrence("report", occurrence, envelope(), due).outcome == "kept"
    assert "report" in store.schedules()
    info = store.get(occurrence)
    assert info is not None and info.state == "due"
    assert store.reschedule(occurrence, delay=60) is not None and store.cancel(occurrence)


def test_exactly_once_is_refused_up_front_when_targets_cannot_share_the_slot(
    redis_cluster: RedisClusterServers, store: DelayStore, namespace: str
) -> None:
    tagged = DirectLists({"ready": ListTarget(f"{{{namespace}}}:ready")})
    with pytest.raises(ConfigurationError, match="shards=6"):
        Promoter(store, tagged)
    single = DelayStore.from_url(redis_cluster.url, namespace=f"{namespace}-one")
    try:
        with pytest.raises(ConfigurationError, match="not in slot"):
            Promoter(single, DirectLists({"ready": ListTarget("plain:ready")}))
        # Targets carrying the namespace's hash tag share its slot: exactly-once works on a cluster too.
        target = f"{{{namespace}-one}}:ready"
        single.park("one", envelope(b"once"), delay=0.2)
        promoter = Promoter(single, DirectLists({"ready": ListTarget(target)}), max_idle=1.0).start()
        try:
            wait(lambda: single.client.llen(target) == 1, what="promoted")
        finally:
            promoter.stop()
        assert single.stats().counters["promoted"] == 1
        single.client.delete(target, *single.keys.all())
    finally:
        single.client.close()


def test_a_plain_url_to_one_node_says_to_use_a_cluster_url(redis_cluster: RedisClusterServers, namespace: str) -> None:
    refused = 0
    for url in redis_cluster.plain_urls:
        plain = DelayStore.from_url(url, namespace=namespace)
        try:
            plain.stats()
        except WrongNode as error:
            refused += 1
            assert "redis+cluster://" in str(error)
        finally:
            plain.client.close()
    assert refused == 2, "the two masters that do not own the namespace's slot refuse, clearly"


def test_the_shard_count_is_the_namespace_s_and_checked(redis_cluster: RedisClusterServers, store: DelayStore) -> None:
    store.park("x", envelope(), delay=60)
    same = DelayStore.from_url(redis_cluster.url, namespace=store.keys.namespace)
    assert len(same.shards) == SHARDS and same.get("x") is not None, "read from the namespace"
    other = DelayStore.from_url(redis_cluster.url, namespace=store.keys.namespace, shards=3)
    with pytest.raises(ConfigurationError, match="has 6 shard"):
        other.stats()
    same.client.close()
    other.client.close()


def test_the_cli_aggregates_every_shard(redis_cluster: RedisClusterServers, store: DelayStore) -> None:
    store.park_many([ParkRequest(f"c-{n}", envelope(), delay=120 + n) for n in range(30)])
    runner = CliRunner()
    base = ["--redis-url", redis_cluster.url, "--namespace", store.keys.namespace]
    result = runner.invoke(cli, ["stats", *base, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["parked"] == 30
    result = runner.invoke(cli, ["ls", *base, "--json", "--limit", "5"])
    assert result.exit_code == 0, result.output
    assert [row["id"] for row in json.loads(result.output)["messages"]] == [f"c-{n}" for n in range(5)]
    result = runner.invoke(cli, ["cancel", "c-9", *base, "--yes"])
    assert result.exit_code == 0, result.output
    assert store.get("c-9") is None


def test_wait_after_write_goes_to_the_shard_s_own_master(redis_cluster: RedisClusterServers, namespace: str) -> None:
    # No replicas in this cluster: a durable write is refused with a clear error, on whichever master it went to.
    durable = DelayStore.from_url(redis_cluster.url, namespace=namespace, shards=3, replicas=1, replica_timeout=0.1)
    try:
        with pytest.raises(NotReplicated, match="confirmed by 0 of 1 replica"):
            durable.park("d", envelope(), delay=60)
    finally:
        durable.client.close()


def test_a_durable_write_follows_moved_when_the_slot_map_it_reads_again_is_stale(
    redis_cluster: RedisClusterServers, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after a reshard the node asked for the slot map may not know of the move yet (redis-cli reported
    "Nodes don't agree" between moves): a durable write must go where the MOVED reply says, not back to the
    slot's old owner. The stale answer is made certain here by keeping the client's map as it was."""
    # No replicas in this cluster: a write that reached the slot's master ends in NotReplicated, not WrongNode.
    store = DelayStore.from_url(redis_cluster.url, namespace=namespace, shards=3, replicas=1, replica_timeout=0.05)
    key = store.shards[1].due
    before, after = [id for id in (f"job-{n}" for n in range(100)) if store.shard_for(id) == 1][:2]
    with pytest.raises(NotReplicated):
        store.park(before, envelope(), delay=60)
    old = redis_cluster.node_of_key(key)
    new = (old + 1) % len(redis_cluster.ports)
    monkeypatch.setattr(store.client.nodes_manager, "initialize", lambda *args, **kwargs: None)
    _move_slot(redis_cluster, key_slot(key.encode()), old, new)
    try:
        with pytest.raises(NotReplicated):
            store.park(after, envelope(), delay=60)
        assert redis_cluster.node_client(new).zscore(key, after) is not None
    finally:
        _move_slot(redis_cluster, key_slot(key.encode()), new, old)
        store.client.close()


def _move_slot(cluster: RedisClusterServers, slot: int, source: int, target: int) -> None:
    """Move ``slot`` and its keys from node ``source`` to node ``target``, as redis-cli --cluster reshard does."""
    nodes = [cluster.node_client(index) for index in range(len(cluster.ports))]
    ids = [node.execute_command("CLUSTER MYID") for node in nodes]
    nodes[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
    nodes[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
    while keys := nodes[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
        nodes[source].execute_command("MIGRATE", "127.0.0.1", cluster.ports[target], "", 0, 5000, "KEYS", *keys)
    for node in nodes:
        node.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
        node.close()


def test_promoters_go_on_after_a_clean_failover_of_a_master(namespace: str) -> None:
    """A CLUSTER FAILOVER leaves the old master up, as a replica. Durable writes (replicas=1) end with a WAIT,
    which nothing redirects from it: the slot map must be read again, and promotion go on by itself."""
    from .ha_servers import RedisClusterServers

    with RedisClusterServers(replicas=1) as cluster:
        store = DelayStore.from_url(cluster.url, namespace=namespace, shards=3, replicas=1, replica_timeout=1.0)
        target = ListTarget(f"{{{namespace}}}:ready")
        promoter = Promoter(store, ListDeliverer(store.client, {"ready": target}), max_idle=0.5, lease=3).start()
        try:
            store.park_many([ParkRequest(f"before-{n}", envelope(), delay=0.1) for n in range(30)])
            ready = cluster.client()
            wait(lambda: ready.llen(target.list_key) == 30, what="promoted before the failover")
            node = cluster.node_of_key(store.shards[1].due)
            replica = cluster.replica_of(node)
            assert replica is not None
            store.park_many([ParkRequest(f"after-{n}", envelope(), delay=3) for n in range(30)])
            cluster.node_client(replica).execute_command("CLUSTER FAILOVER")
            wait(lambda: cluster.replica_of(replica) == node, what="the old master replicating the new one")
            wait(lambda: ready.llen(target.list_key) == 60, what="every message promoted after the failover")
            assert store.stats().parked == 0
        finally:
            promoter.stop()
            store.client.close()


def test_with_shard_0_s_master_down_the_other_shards_park_and_reschedule(namespace: str) -> None:
    # cluster-require-full-coverage no: the set-up in which a master that is down holds up its own shards only.
    from .ha_servers import RedisClusterServers

    with RedisClusterServers(extra_args=["--cluster-require-full-coverage", "no"]) as cluster:
        options = {"socket_timeout": 2.0, "socket_connect_timeout": 1.0}
        store = DelayStore.from_url(cluster.url, namespace=namespace, shards=SHARDS, **options)
        home = cluster.node_of_key(store.shards[0].due)
        other = next(s for s in range(1, SHARDS) if cluster.node_of_key(store.shards[s].due) != home)
        ids = [f"job-{n}" for n in range(5000) if store.shard_for(f"job-{n}") == other][:2]
        store.park(ids[0], envelope(), delay=3600)  # the layout is read and recorded while all is up
        healthy = cluster.node_client(cluster.node_of_key(store.shards[other].due))  # asked while all answer
        cluster.nodes[home].stop(crash=True)
        healthy.script_flush()  # as after a restart of that node: its scripts must be loaded again
        wait_for(lambda: _parks(store, ids[1]), 30, "a park into a healthy shard")
        info = store.get(ids[1])
        assert info is not None and info.state == "due"
        # Parked earlier than the shard's head: the wake relayed through shard 0's list is lost, not the park.
        assert store.reschedule(ids[0], delay=1) is not None
        store.client.close()


def _parks(store: DelayStore, id: str) -> bool:
    """Parks ``id`` due now (earlier than its shard's head, so a wake is relayed); False while the cluster has
    not yet noticed the master that went down."""
    try:
        store.park(id, envelope(), delay=0.5)
    except WrongNode:
        return False
    return True


def test_check_finds_and_repairs_packs_of_every_shard_on_its_own_node(
    store: DelayStore, redis_cluster: RedisClusterServers
) -> None:
    """``delay-broker check`` SCANs each shard's keys on the master holding the shard's slot."""
    from delay_broker.store.checking import check_store, repair_store

    ids = [str(uuid.uuid4()) for _ in range(600)]
    store.park_many([ParkRequest(id, envelope(id.encode()), delay=3600) for id in ids])
    assert store.stats().packed == 600
    client = store.client
    damaged = {0, 3, 5}
    for shard in damaged:  # every index partition of the shard deleted: its records orphaned
        space = store.shards[shard]
        node = client.get_node_from_key(space.packs)
        for key in list(client.scan_iter(match=space.key("packed:*"), target_nodes=node)):
            client.delete(key)
    report = check_store(store)
    found = {shard.shard for shard in report.shards if shard.findings}
    assert found == damaged and {finding.kind for finding in report.findings} == {"record_orphaned"}
    orphans = sum(len(shard.findings) for shard in report.shards)
    assert orphans == sum(shard.records for shard in report.shards if shard.shard in damaged)
    repaired = repair_store(store)
    assert repaired.repaired == Counter(record_orphaned=orphans) and not repaired.left.damaged
    result = CliRunner().invoke(cli, ["check", "--redis-url", redis_cluster.url, "--namespace", store.keys.namespace])
    assert result.exit_code == 0 and "No damage found" in result.output, result.output
    assert all((info := store.get(id)) is not None and info.state == "due" for id in ids)
