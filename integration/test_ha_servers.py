"""Smoke tests of the private Redis Cluster and Sentinel set-ups (integration/ha_servers.py): they are real, our
URL forms reach them, a Sentinel failover moves the master, and every process goes away with its Python process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from delay_broker.connect import client_from_url, master_address

from .ha_servers import RedisClusterServers, SentinelSet

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------------- Cluster


def test_cluster_spreads_hash_tags_over_the_masters(redis_cluster: RedisClusterServers, unique: str) -> None:
    assert len(redis_cluster.ports) == 3
    nodes = [redis_cluster.node_client(index) for index in range(redis_cluster.masters)]
    assert all(node.cluster("INFO")["cluster_state"] == "ok" for node in nodes)
    client = redis_cluster.client()
    used = set()
    for tag in range(30):
        key = f"ha-{unique}:{{t{tag}}}:k"
        index = redis_cluster.node_of_key(key)
        assert client.get_node_from_key(key).port == redis_cluster.ports[index]
        used.add(index)
        # The key lives on that node only: the others redirect.
        client.set(key, b"v")
        assert nodes[index].get(key) == b"v"
        with pytest.raises(MovedError):
            nodes[(index + 1) % 3].get(key)
        client.delete(key)
    assert used == {0, 1, 2}


def test_cluster_url_and_plain_urls(redis_cluster: RedisClusterServers, unique: str) -> None:
    assert redis_cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in redis_cluster.ports)
    assert redis_cluster.plain_urls == [f"redis://127.0.0.1:{port}/0" for port in redis_cluster.ports]
    client = client_from_url(redis_cluster.url)
    assert isinstance(client, RedisCluster)
    try:
        keys = [f"ha-{unique}:{{u{n}}}" for n in range(10)]
        for key in keys:
            client.set(key, key)
        assert [client.get(key) for key in keys] == [key.encode() for key in keys]
        assert {client.get_node_from_key(key).port for key in keys} == set(redis_cluster.ports)
        client.delete(*keys)
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------------- Sentinel


def write_with_retries(client: redis.Redis, key: str, value: str, timeout: float = 10.0) -> int:
    """SET until it works (right after a failover the first tries may fail); the number of failed tries."""
    deadline = time.monotonic() + timeout
    failures = 0
    while True:
        try:
            client.set(key, value)
            return failures
        except (redis.ConnectionError, redis.ReadOnlyError, redis.TimeoutError):
            failures += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_sentinel_set_is_a_master_with_a_replica(redis_sentinel: SentinelSet, unique: str) -> None:
    assert redis_sentinel.url == f"redis+sentinel://127.0.0.1:{redis_sentinel.sentinel_port}/mymaster/0"
    host, port = redis_sentinel.master_address()
    assert host == "127.0.0.1" and port in redis_sentinel.ports
    master, replica = redis_sentinel.master_client(), redis_sentinel.replica_client()
    assert master.execute_command("ROLE")[0] == b"master"
    assert replica.execute_command("ROLE")[0] == b"slave"
    key = f"ha-{unique}:repl"
    master.set(key, b"1")
    master.execute_command("WAIT", 1, 5000)
    assert replica.get(key) == b"1"
    with pytest.raises(redis.ReadOnlyError):
        replica.set(key, b"2")
    master.delete(key)


def test_sentinel_url_follows_a_failover(redis_sentinel: SentinelSet, unique: str) -> None:
    client = client_from_url(redis_sentinel.url)
    key = f"ha-{unique}:failover"
    try:
        client.set(f"{key}:before", b"1")
        assert client.execute_command("WAIT", 1, 5000) == 1
        old = redis_sentinel.master_address()
        assert master_address(client) == old

        seconds = redis_sentinel.failover()
        new = redis_sentinel.master_address()
        assert new != old
        print(f"failover took {seconds:.2f} s")

        failures = write_with_retries(client, f"{key}:after", "2")
        print(f"the client's first write after the failover failed {failures} time(s)")
        assert master_address(client) == new
        master = redis_sentinel.master_client()
        assert master.connection_pool.connection_kwargs["port"] == new[1]
        assert master.get(f"{key}:before") == b"1"
        assert master.get(f"{key}:after") == b"2"
        assert redis_sentinel.replica_client().execute_command("ROLE")[1:3] == [b"127.0.0.1", new[1]]

        # The set is healthy again: a second failover moves the master back.
        redis_sentinel.failover()
        assert redis_sentinel.master_address() == old
        write_with_retries(client, f"{key}:back", "3")
        assert redis_sentinel.master_client().get(f"{key}:back") == b"3"
        client.delete(f"{key}:before", f"{key}:after", f"{key}:back")
    finally:
        client.close()


def test_sentinel_set_options() -> None:
    with SentinelSet(["--min-replicas-to-write", "1"], appendonly=True) as sentinel:
        master = sentinel.master_client()
        assert master.config_get("min-replicas-to-write") == {"min-replicas-to-write": "1"}
        assert master.config_get("appendonly") == {"appendonly": "yes"}
        assert master.set("ha-options", b"1")
        directory = sentinel.directory
        assert directory.is_dir()
    assert not directory.exists()


# ---------------------------------------------------------------------------------------------------- clean-up

CHILD = textwrap.dedent(
    """
    import signal, sys, time
    # Python leaves SIGINT ignored when it starts with it ignored (a suite run from nohup or a background job):
    # this child stands for an ordinary program, where Ctrl-C raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from integration.ha_servers import SentinelSet, processes
    sentinel = SentinelSet().start()
    print(" ".join(str(server.process.pid) for server in processes()), flush=True)
    print(sentinel.directory, flush=True)
    time.sleep(120)
    """
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (a child of the dead Python process not yet reaped by init) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_servers_die_with_their_python_process(sig: signal.Signals) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    directory: Path | None = None
    try:
        assert child.stdout is not None
        pids = [int(pid) for pid in child.stdout.readline().split()]
        directory = Path(child.stdout.readline().strip())
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
        child.send_signal(sig)
        child.wait(20)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids)
        if sig != signal.SIGKILL:
            assert not directory.exists()
        else:  # SIGKILL leaves no chance to remove the directory: the next set-up does
            assert directory.exists()
            SentinelSet().close()
            assert not directory.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if directory is not None and directory.name.startswith("delay-broker-sentinel-"):
            shutil.rmtree(directory, ignore_errors=True)
