"""The rebalance part of benchmarks/bench_scale.py: a whole ``redis-cli --cluster rebalance`` onto a new master under
load (integration/rebalance_load.py, on a bigger load than its test), and how long ``MIGRATE`` of one big pack
blocks its master."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from redis.crc import key_slot

from delay_broker import DelayStore, Envelope, ParkRequest
from integration.cluster_moves import SlotMove
from integration.ha_servers import HOST, RedisClusterServers
from integration.rebalance_load import Plan, run

from .common import delete_store

PLAN = Plan(rate=150.0, warmup=5.0, after=5.0, pipeline=2, shards=12, batch=200, backlog=20_000, backlog_payload=250)


def rebalance_under_load(plan: Plan = PLAN) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's outcome, and the big pack moves measured afterwards on the same 4-master cluster."""
    with RedisClusterServers(3, replicas=1) as cluster:
        outcome = run(cluster, plan)
        moves = [migrate_big_keys(cluster, n, 250, packed=True) for n in (20_000, 100_000, 300_000)]
        moves += [migrate_big_keys(cluster, n, 250, packed=False) for n in (20_000, 100_000)]
    figures = {key: value for key, value in vars(outcome).items() if key != "output"}
    return figures, {"moves": moves}


def migrate_big_keys(cluster: RedisClusterServers, messages: int, payload: int, *, packed: bool) -> dict[str, Any]:
    """``messages`` parked into one shard: due in 2 days at the same time, so in one pack (``packed``), or in the
    ordinary layout (``due`` and ``msg`` hold them all). That pack's key, or those two, moved with one ``MIGRATE``
    (as a rebalance moves a slot's keys) while a probe PINGs the source master: the move's time, the longest
    PING."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {"pack_after": None} if not packed else {}
    store = DelayStore.from_url(cluster.url, namespace=name, shards=1, socket_timeout=60.0, **options)
    due = datetime.now(timezone.utc) + timedelta(days=2)
    body = b"p" * payload
    for start in range(0, messages, 1000):
        chunk = min(1000, messages - start)
        store.park_many([ParkRequest(str(uuid.uuid4()), Envelope("ready", body), due=due) for _ in range(chunk)])
    space = store.shards[0]
    first_pack = store.client.zrange(space.packs, 0, 0)
    keys = [space.pack(first_pack[0].decode())] if packed else [space.due, space.msg]
    source = cluster.node_of_key(keys[0])
    size = sum(int(cluster.node_client(source).memory_usage(key) or 0) for key in keys)
    target = next(index for index in range(cluster.masters) if index != source)
    move = SlotMove(cluster, key_slot(keys[0].encode()), source, target).begin()
    probe = _Probe(cluster.node_client(source, socket_timeout=60.0))
    probe.start()
    started = time.perf_counter()
    move.nodes[source].execute_command("MIGRATE", HOST, cluster.ports[target], "", 0, 120_000, "KEYS", *keys)
    seconds = time.perf_counter() - started
    longest_ping = probe.stop()
    move.finish()
    delete_store(store)
    store.client.close()
    what = "one pack" if packed else "due + msg"
    return {"messages": messages, "what": what, "bytes": size, "seconds": seconds, "longest_ping": longest_ping}


class _Probe:
    """PINGs a server back to back from a thread of its own; the longest answer, in seconds."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        time.sleep(0.05)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.client.ping()
            self.longest = max(self.longest, time.perf_counter() - started)
            time.sleep(0.001)

    def stop(self) -> float:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(70)
        return self.longest
