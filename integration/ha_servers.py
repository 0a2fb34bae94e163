"""Private high-availability Redis set-ups for the integration tests: a Redis Cluster and a Sentinel set.

Everything runs real ``redis-server`` processes on 127.0.0.1, on free ports, with data and logs in a temporary
directory of its own; nothing touches a system Redis (6379/26379). Every process is started in a process group
of its own and recorded in a module-level registry, so it is stopped

- by ``close()`` (the fixtures call it at the end of the session or module),
- by an ``atexit`` handler if ``close()`` never ran (interrupted run, a test that left things half started),
- on SIGTERM too: the first server started installs a SIGTERM handler that raises KeyboardInterrupt, so pytest
  tears its fixtures down as on Ctrl-C (Python's default would die without running ``atexit``),
- and, where util-linux's ``setpriv`` is installed, by the kernel when the Python process dies without any
  clean-up at all (SIGKILL): each server started from the main thread runs under ``setpriv --pdeathsig KILL``
  (see ``dying_with_this_process``). The directories such a run leaves are removed by the next run (each holds
  its owner's pid; only those of dead owners go).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import redis
from redis.cluster import RedisCluster

from delay_broker.embedded import dying_with_this_process, free_port, redis_executable
from tests.helpers import wait_for

HOST = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10000
SYNC_CHANNEL = "__delay_broker_ha_servers__:sync"
PROBE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError)


# ---------------------------------------------------------------------------------------------------- clean-up


_registry_lock = threading.Lock()
_running: dict[int, ServerProcess] = {}
_directories: set[Path] = set()
_handlers_installed = False


def install_handlers() -> None:
    """Once per process: the atexit clean-up and, if SIGTERM still has Python's default, a SIGTERM handler."""
    global _handlers_installed
    with _registry_lock:
        if _handlers_installed:
            return
        _handlers_installed = True
    atexit.register(stop_everything)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Restore the default first: a second SIGTERM ends the process at once (atexit and pdeathsig still apply).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum}")


def stop_everything() -> None:
    """Stop every server this module started and is still running, remove their directories (atexit)."""
    with _registry_lock:
        processes = list(_running.values())
        directories = list(_directories)
    for process in processes:
        process.stop(timeout=3.0)
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
    with _registry_lock:
        _directories.difference_update(directories)


DIRECTORY_PREFIXES = ("delay-broker-cluster-", "delay-broker-sentinel-", "delay-broker-redis-")
OWNER_FILE = "owner.pid"


def _make_directory(prefix: str) -> Path:
    _sweep_orphaned_directories()
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    (directory / OWNER_FILE).write_text(str(os.getpid()))
    with _registry_lock:
        _directories.add(directory)
    return directory


def _sweep_orphaned_directories() -> None:
    """Remove directories of ours that a killed run (SIGKILL: no atexit) left; only when their owner is dead."""
    for prefix in DIRECTORY_PREFIXES:
        for directory in Path(tempfile.gettempdir()).glob(prefix + "*"):
            try:
                owner = int((directory / OWNER_FILE).read_text())
            except (OSError, ValueError):
                continue  # not one of ours, or still being made
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                shutil.rmtree(directory, ignore_errors=True)
            except PermissionError:
                pass


def _remove_directory(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    with _registry_lock:
        _directories.discard(directory)


# ---------------------------------------------------------------------------------------------------- helpers


def _executable(name: str) -> str:
    path = redis_executable(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (Debian: apt-get install redis-server)")
    return path


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def free_cluster_port(taken: set[int]) -> int:
    """A free port whose cluster bus port (port + 10000) is free too, and not in ``taken``."""
    for _ in range(200):
        port = free_port()
        bus = port + CLUSTER_BUS_OFFSET
        if bus <= 65535 and not {port, bus} & taken and _port_free(bus):
            return port
    raise RuntimeError("found no free port pair (port, port + 10000) on 127.0.0.1")


def _info(client: redis.Redis, section: str) -> dict[str, str]:
    """``INFO <section>`` with every value as a string (redis-py parses numbers)."""
    return {str(key): str(_text(value)) for key, value in client.info(section).items()}


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


class ServerProcess:
    """One ``redis-server`` (data node or Sentinel) in a process group of its own, logging to ``log``."""

    def __init__(self, name: str, port: int, directory: Path, arguments: list[str], log: Path) -> None:
        self.name = name
        self.port = port
        self.directory = directory
        self.arguments = arguments
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> ServerProcess:
        install_handlers()
        self.directory.mkdir(parents=True, exist_ok=True)
        command = dying_with_this_process([_executable("redis-server"), *self.arguments])
        with open(self.directory / "stderr.log", "ab") as stderr:
            self.process = subprocess.Popen(
                command,
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with _registry_lock:
            _running[self.process.pid] = self
        try:
            wait_for(self._ready, timeout, f"{self.name} did not answer PING on port {self.port}")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
        client = self.client(socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(client.ping())
        except PROBE_ERRORS:
            return False
        finally:
            client.close()

    def client(self, **options: Any) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, **options)

    def log_tail(self, size: int = 3000) -> str:
        parts = []
        for path in (self.log, self.directory / "stderr.log"):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").strip()
                if text:
                    parts.append(f"--- {path}\n{text[-size:]}")
        return "\n".join(parts) or "(no log)"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 10.0, *, crash: bool = False) -> None:
        """SIGTERM (a clean shutdown), or with ``crash`` SIGKILL at once: what the append-only file kept is all
        that :meth:`start` finds again."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL if crash else signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        else:
            process.wait()
        with _registry_lock:
            _running.pop(process.pid, None)
        self.process = None


def _data_node_arguments(port: int, directory: Path, log: Path, extra: list[str]) -> list[str]:
    return [
        "--port", str(port),
        "--bind", HOST,
        "--dir", str(directory),
        "--save", "",
        "--daemonize", "no",
        "--logfile", str(log),
        *extra,
    ]  # fmt: skip


def _start_with_fresh_ports(make: Callable[[], ServerProcess], attempts: int = 4) -> ServerProcess:
    """Start a server; if another process grabbed its port meanwhile, try again with a new one."""
    for attempt in range(attempts):
        server = make()
        try:
            return server.start()
        except RuntimeError as error:
            if "Address already in use" not in str(error) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


class StandaloneServer:
    """One ``redis-server`` of its own (``extra`` arguments, e.g. an append-only file) that can crash and restart.

    :meth:`crash` is SIGKILL; :meth:`restart` starts it again on the same port and directory, so it loads what its
    persistence kept.
    """

    def __init__(self, name: str, extra: list[str] | None = None) -> None:
        self.directory = _make_directory("delay-broker-redis-")
        self.node = _start_with_fresh_ports(lambda: self._node(name, list(extra or [])))

    def _node(self, name: str, extra: list[str]) -> ServerProcess:
        port = free_port()
        log = self.directory / "redis.log"
        return ServerProcess(name, port, self.directory, _data_node_arguments(port, self.directory, log, extra), log)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.node.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        return self.node.client(**options)

    def crash(self) -> None:
        self.node.stop(crash=True)

    def restart(self, timeout: float = 120.0) -> None:
        self.node.start(timeout)

    def close(self) -> None:
        self.node.stop()
        _remove_directory(self.directory)


# ---------------------------------------------------------------------------------------------------- Cluster


class RedisClusterServers:
    """A Redis Cluster of ``masters`` master nodes, each with ``replicas`` replicas (none by default), on
    127.0.0.1, slots spread by ``redis-cli``.

    ``url`` is our ``redis+cluster://`` form (for ``delay_broker.connect.client_from_url``); ``client()`` is a
    :class:`redis.cluster.RedisCluster`; ``node_client(i)`` a plain client of node ``i``. Clients made here are
    closed by :meth:`close`.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 2000,
        extra_args: list[str] | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.extra_args = list(extra_args or [])
        self.directory = _make_directory("delay-broker-cluster-")
        self.nodes: list[ServerProcess] = []
        self._clients: list[Any] = []
        self.startup_seconds: float | None = None

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    @property
    def plain_urls(self) -> list[str]:
        return [f"redis://{HOST}:{port}/0" for port in self.ports]

    def client(self, **options: Any) -> RedisCluster:
        client = RedisCluster(host=HOST, port=self.ports[0], **options)
        self._clients.append(client)
        return client

    def node_client(self, index: int, **options: Any) -> redis.Redis:
        client = self.nodes[index].client(**options)
        self._clients.append(client)
        return client

    def start(self, timeout: float = 60.0) -> RedisClusterServers:
        started = time.monotonic()
        try:
            for index in range(self.masters * (1 + self.replicas)):
                self.nodes.append(_start_with_fresh_ports(lambda index=index: self._node(index)))
            self._create(timeout)
            wait_for(self._converged, timeout, "the cluster did not reach cluster_state:ok on every node")
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _node(self, index: int) -> ServerProcess:
        port = free_cluster_port({p for node in self.nodes for p in (node.port, node.port + CLUSTER_BUS_OFFSET)})
        directory = self.directory / f"node{index}"
        log = directory / "redis.log"
        arguments = _data_node_arguments(port, directory, log, [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(directory / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "no",
            *self.extra_args,
        ])  # fmt: skip
        return ServerProcess(f"cluster node {index}", port, directory, arguments, log)

    def _create(self, timeout: float) -> None:
        addresses = [f"{HOST}:{port}" for port in self.ports]
        arguments = ["create", *addresses, "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        redis_cli_cluster(arguments, timeout, self.directory / "cluster-create.log")

    def start_node(self) -> int:
        """Start one more cluster-enabled node, not yet part of the cluster (see integration/cluster_moves.py); its
        index."""
        index = len(self.nodes)
        self.nodes.append(_start_with_fresh_ports(lambda: self._node(index)))
        return index

    def _converged(self) -> bool:
        for node in self.nodes:
            if not node.running:
                raise RuntimeError(f"{node.name} exited:\n{node.log_tail()}")
            client = node.client(socket_timeout=1, socket_connect_timeout=1)
            try:
                info = _info_text(client.execute_command("CLUSTER INFO"))
                replication = _info(client, "replication")
            except PROBE_ERRORS:
                return False
            finally:
                client.close()
            expected = {
                "cluster_state": "ok",
                "cluster_slots_ok": "16384",
                "cluster_known_nodes": str(len(self.nodes)),
                "cluster_size": str(self.masters),
            }
            if any(info.get(key) != value for key, value in expected.items()):
                return False
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        return True

    def replica_of(self, index: int) -> int | None:
        """The index of a node that replicates node ``index`` now, if one does."""
        port = self.nodes[index].port
        for other, node in enumerate(self.nodes):
            if node.running and other != index:
                client = node.client(socket_timeout=1)
                try:
                    replication = _info(client, "replication")
                finally:
                    client.close()
                if replication.get("role") == "slave" and int(replication.get("master_port", 0)) == port:
                    return other
        return None

    def node_of_key(self, key: str | bytes) -> int:
        """The index of the node that serves ``key``, asked of the nodes themselves (``CLUSTER SHARDS``-free)."""
        client = self.nodes[0].client()
        try:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            for first, last, (_host, port, *_), *_ in client.execute_command("CLUSTER SLOTS"):
                if int(first) <= slot <= int(last):
                    return self.ports.index(int(port))
        finally:
            client.close()
        raise LookupError(f"no node serves slot {slot}")

    def close(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        for node in self.nodes:
            node.stop()
        _remove_directory(self.directory)

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def redis_cli_cluster(arguments: list[str], timeout: float, log: Path) -> str:
    """``redis-cli --cluster <arguments>``, its output kept in ``log`` (appended) and returned; RuntimeError with the
    output's end when it fails or outlasts ``timeout``."""
    command = [_executable("redis-cli"), "--cluster", *arguments]
    try:
        result = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            start_new_session=True,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"redis-cli --cluster {arguments[0]} did not finish within {timeout:.0f} s") from error
    with open(log, "ab") as file:
        file.write(result.stdout)
    output = result.stdout.decode(errors="replace")
    if result.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster {arguments[0]} failed ({result.returncode}):\n{output[-3000:]}")
    return output


def _info_text(raw: Any) -> dict[str, str]:
    text = _text(raw)
    if isinstance(text, dict):  # some redis-py versions parse CLUSTER INFO
        return {str(key): str(_text(value)) for key, value in text.items()}
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


# ---------------------------------------------------------------------------------------------------- Sentinel


SENTINEL_TIMERS = {"info-period": 1000, "publish-period": 500, "tilt-period": 5000}
"""``SENTINEL DEBUG`` timers (Redis >= 7.0) for :class:`SentinelSet`. With the defaults (INFO every 10 s, a demoted
master reconfigured 4 publish periods = 8 s after it last reported its role) a manual failover takes ~21 s until
the Sentinel sees the old master replicating again; with these, ~3 s. The failover itself is unchanged."""


class SentinelSet:
    """One master, one replica and one Sentinel (quorum 1) watching them as ``mymaster``, all on 127.0.0.1.

    ``extra_args`` go to both data nodes (e.g. ``["--min-replicas-to-write", "1"]``); ``appendonly`` turns on
    their append-only files; ``fast_timers`` applies :data:`SENTINEL_TIMERS`. :meth:`failover` makes the
    Sentinel swap the roles and waits until the set is healthy again (new master answers as master, old master
    replicates from it with its link up, the Sentinel knows it as a replica), so another failover can follow.
    Clients made here are closed by :meth:`close`.
    """

    service = "mymaster"

    def __init__(
        self,
        extra_args: list[str] | None = None,
        *,
        appendonly: bool = False,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        fast_timers: bool = True,
    ) -> None:
        self.extra_args = list(extra_args or [])
        self.appendonly = appendonly
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.fast_timers = fast_timers
        self.directory = _make_directory("delay-broker-sentinel-")
        self.data_nodes: list[ServerProcess] = []
        self.sentinel: ServerProcess | None = None
        self._clients: list[Any] = []
        self.startup_seconds: float | None = None

    # ----------------------------------------------------------------------------------------- addresses

    @property
    def sentinel_port(self) -> int:
        assert self.sentinel is not None, "not started"
        return self.sentinel.port

    @property
    def url(self) -> str:
        return f"redis+sentinel://{HOST}:{self.sentinel_port}/{self.service}/0"

    @property
    def ports(self) -> list[int]:
        """The data nodes' ports (master and replica, in the order they were started)."""
        return [node.port for node in self.data_nodes]

    def sentinel_client(self, **options: Any) -> redis.Redis:
        assert self.sentinel is not None, "not started"
        client = self.sentinel.client(**{"socket_timeout": 5, "socket_connect_timeout": 2, **options})
        self._clients.append(client)
        return client

    def _ask_sentinel(self, *command: Any) -> Any:
        assert self.sentinel is not None, "not started"
        client = self.sentinel.client(socket_timeout=5, socket_connect_timeout=2)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def master_address(self) -> tuple[str, int]:
        """The master's address as the Sentinel reports it now."""
        host, port = self._ask_sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return _text(host), int(port)

    def _node_at(self, port: int) -> ServerProcess:
        for node in self.data_nodes:
            if node.port == port:
                return node
        raise LookupError(f"no data node of this set listens on port {port}")

    def master_node(self) -> ServerProcess:
        return self._node_at(self.master_address()[1])

    def replica_node(self) -> ServerProcess:
        master = self.master_node()
        return next(node for node in self.data_nodes if node is not master)

    def master_client(self, **options: Any) -> redis.Redis:
        """A plain client of the node that is master now (it does not follow a later failover)."""
        client = self.master_node().client(**options)
        self._clients.append(client)
        return client

    def replica_client(self, **options: Any) -> redis.Redis:
        """A plain client of the node that is replica now."""
        client = self.replica_node().client(**options)
        self._clients.append(client)
        return client

    # ----------------------------------------------------------------------------------------- life cycle

    def start(self, timeout: float = 30.0) -> SentinelSet:
        started = time.monotonic()
        try:
            master = _start_with_fresh_ports(lambda: self._data_node("node0", []))
            self.data_nodes.append(master)
            replica = _start_with_fresh_ports(lambda: self._data_node("node1", ["--replicaof", HOST, str(master.port)]))
            self.data_nodes.append(replica)
            wait_for(
                lambda: self._replicating(master, replica),
                timeout,
                f"the replica did not sync with the master\n{replica.log_tail()}",
            )
            self.sentinel = _start_with_fresh_ports(lambda: self._sentinel_node(master.port))
            if self.fast_timers:
                self._ask_sentinel(
                    "SENTINEL", "DEBUG", *(str(item) for pair in SENTINEL_TIMERS.items() for item in pair)
                )
            wait_for(lambda: self._sentinel_healthy(master, replica), timeout, "the Sentinel did not see the replica")
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _data_node(self, name: str, extra: list[str]) -> ServerProcess:
        port = free_port()
        directory = self.directory / name
        log = directory / "redis.log"
        arguments = _data_node_arguments(port, directory, log, [
            "--appendonly", "yes" if self.appendonly else "no",
            "--repl-diskless-sync-delay", "0",  # the default waits 5 s for more replicas before a full sync
            *extra,
            *self.extra_args,
        ])  # fmt: skip
        return ServerProcess(f"data node {name}", port, directory, arguments, log)

    def _sentinel_node(self, master_port: int) -> ServerProcess:
        port = free_port()
        directory = self.directory / "sentinel"
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / "sentinel.log"
        config = directory / "sentinel.conf"  # the Sentinel rewrites it: it must be writable, and ours alone
        config.write_text(
            "\n".join([
                f"port {port}",
                f"bind {HOST}",
                f"dir {directory}",
                "daemonize no",
                f"logfile {log}",
                f"sentinel monitor {self.service} {HOST} {master_port} 1",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {self.service} 1",
                "",
            ])
        )  # fmt: skip
        return ServerProcess("sentinel", port, directory, [str(config), "--sentinel"], log)

    @staticmethod
    def _replicating(master: ServerProcess, replica: ServerProcess) -> bool:
        """``replica`` replicates ``master`` with its link up, and has acknowledged the master's latest offset.

        The last part matters: after a diskless full sync the master streams nothing to the replica until the
        replica's first ``REPLCONF ACK`` (up to 1 s later), so writes made in that second would be missing on the
        replica if it were promoted right away. A ``PUBLISH`` to a channel nobody listens to advances the
        replication offset without writing data; ``WAIT 1`` then says whether the replica has caught up with it.
        """
        for node in (master, replica):
            if not node.running:
                raise RuntimeError(f"{node.name} exited:\n{node.log_tail()}")
        master_client = master.client(socket_timeout=2, socket_connect_timeout=1)
        replica_client = replica.client(socket_timeout=2, socket_connect_timeout=1)
        try:
            ours = _info(master_client, "replication")
            theirs = _info(replica_client, "replication")
            linked = (
                ours.get("role") == "master"
                and ours.get("connected_slaves") == "1"
                and theirs.get("role") == "slave"
                and theirs.get("master_port") == str(master.port)
                and theirs.get("master_link_status") == "up"
                and theirs.get("master_sync_in_progress") == "0"
            )
            if not linked:
                return False
            master_client.publish(SYNC_CHANNEL, b"")
            return int(master_client.wait(1, 250)) >= 1
        except PROBE_ERRORS:
            return False
        finally:
            master_client.close()
            replica_client.close()

    def _sentinel_healthy(self, master: ServerProcess, replica: ServerProcess) -> bool:
        """The Sentinel names ``master``, is not failing over, and knows ``replica`` as a replica with its link ok."""
        assert self.sentinel is not None
        if not self.sentinel.running:
            raise RuntimeError(f"the Sentinel exited:\n{self.sentinel.log_tail()}")
        try:
            state = _pairs(self._ask_sentinel("SENTINEL", "MASTER", self.service))
            replicas = [_pairs(item) for item in self._ask_sentinel("SENTINEL", "REPLICAS", self.service)]
        except PROBE_ERRORS:
            return False
        if int(state.get("port", 0)) != master.port or state.get("flags") != "master":
            return False
        return any(
            int(item.get("port", 0)) == replica.port
            and item.get("flags") == "slave"
            and item.get("role-reported") == "slave"
            and item.get("master-link-status") == "ok"
            and int(item.get("master-port", 0)) == master.port
            for item in replicas
        )

    def failover(self, timeout: float = 30.0) -> float:
        """``SENTINEL FAILOVER``, then wait until the set is healthy with the roles swapped; the seconds it took."""
        started = time.monotonic()
        old = self.master_node()
        new = next(node for node in self.data_nodes if node is not old)
        self._ask_sentinel("SENTINEL", "FAILOVER", self.service)
        wait_for(
            lambda: (
                self.master_address()[1] == new.port
                and self._replicating(new, old)
                and self._sentinel_healthy(new, old)
            ),
            timeout,
            f"the failover from port {old.port} to {new.port} did not complete",
            interval=0.1,
        )
        return time.monotonic() - started

    def close(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        self._clients.clear()
        for node in [self.sentinel, *self.data_nodes]:
            if node is not None:
                node.stop()
        _remove_directory(self.directory)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _pairs(flat: Any) -> dict[str, str]:
    """A Sentinel reply ``[name, value, name, value ...]`` (or redis-py's dict) as a dict of strings."""
    if isinstance(flat, dict):
        return {str(_text(key)): str(_text(value)) for key, value in flat.items()}
    items = [str(_text(item)) for item in flat]
    return dict(zip(items[::2], items[1::2], strict=True))


def processes() -> list[ServerProcess]:
    """The servers of this module that are running now (for tests of the clean-up)."""
    with _registry_lock:
        return list(_running.values())
