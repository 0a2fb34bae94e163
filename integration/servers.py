"""Private servers for the integration tests: a RabbitMQ node, a moto SQS emulator and a PostgreSQL server.

Each gets free ports and a temporary directory of its own; nothing here touches the system's RabbitMQ
(port 5672, /var/lib/rabbitmq) or the default epmd port. A private epmd is started next to each node so it
can be stopped with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from delay_broker.embedded import free_port

# The real scripts: /usr/sbin/rabbitmq-server is a wrapper that switches to the rabbitmq user.
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")

AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def port_open(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _kill_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


class RabbitNode:
    """A private rabbitmq-server node. ``stop``/``start`` keep its data and port (for outage tests)."""

    def __init__(self, extra_conf: str = "") -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="delay-broker-rabbit-"))
        home = self.directory / "home"
        for name in ("home", "mnesia", "log"):
            (self.directory / name).mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "rabbitmq-env.conf").write_text("")
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        (self.directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nlog.console = false\n{extra_conf}\n"
        )
        self.nodename = f"dbtest{uuid.uuid4().hex[:8]}@localhost"
        d = self.directory
        self.env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(d / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """kombu's spelling of the default vhost ("//")."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    @property
    def pika_url(self) -> str:
        """pika's spelling of the default vhost ("/%2F"): pika reads "//" as an empty vhost."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self, timeout: float = 90.0) -> RabbitNode:
        if self.process is not None and self.process.poll() is None:
            return self
        if self.epmd is None or self.epmd.poll() is not None:
            self.epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            _wait(lambda: port_open(self.epmd_port), 10, "private epmd")
        with open(self.directory / "console.log", "ab") as log:
            self.process = subprocess.Popen(
                [str(RABBIT_BIN / "rabbitmq-server")],
                env=self.env,
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait(self._accepts_logins, timeout, f"rabbitmq-server (see {self.directory}/log)")
        return self

    def _accepts_logins(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            console = (self.directory / "console.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"rabbitmq-server exited with {self.process.returncode}:\n{console}")
        if not port_open(self.port):
            return False
        import amqp

        try:
            connection = amqp.Connection(f"127.0.0.1:{self.port}", userid="guest", password="guest", connect_timeout=2)
            connection.connect()
            connection.close()
            return True
        except Exception:
            return False

    def queue_counts(self) -> dict[str, tuple[int, int]]:
        """Each queue's messages ready and delivered but unacknowledged (held by consumers), from rabbitmqctl."""
        command = [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodename, "-q", "list_queues", "name", "messages_ready"]
        output = subprocess.run(
            [*command, "messages_unacknowledged"], env=self.env, capture_output=True, text=True, timeout=120, check=True
        ).stdout
        counts = {}
        for line in output.splitlines():
            name, _, numbers = line.partition("\t")
            ready, _, unacked = numbers.partition("\t")
            if ready.isdigit() and unacked.isdigit():
                counts[name] = (int(ready), int(unacked))
        return counts

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the node gracefully; its data directory and port are kept for :meth:`start`."""
        if self.process is None:
            return
        _kill_group(self.process)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(self.process, signal.SIGKILL)
            self.process.wait(10)
        _kill_group(self.process, signal.SIGKILL)
        self.process = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.epmd is not None:
                self.epmd.kill()
                self.epmd.wait(10)
            shutil.rmtree(self.directory, ignore_errors=True)


class MotoServer:
    """moto in server mode: an SQS-compatible HTTP endpoint on a free port."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="delay-broker-moto-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None
        self.env = env or {}  # e.g. INITIAL_NO_AUTH_ACTION_COUNT: IAM policies enforced after that many calls

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> MotoServer:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                env={**os.environ, **AWS_TEST_ENV, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait(self._ready, timeout, f"moto server (see {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"moto server exited with {self.process.returncode}; see {self.log}")
        try:
            urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1).read()
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            _kill_group(self.process)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                _kill_group(self.process, signal.SIGKILL)
        self.log.unlink(missing_ok=True)


def postgres_bindir() -> Path:
    """The directory of Debian's PostgreSQL server programs (the newest installed version)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not versions:
        raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    return versions[-1].parent


class PostgresServer:
    """A PostgreSQL cluster of its own (initdb in a temporary directory, a free port, trust auth on loopback).

    PostgreSQL refuses to run as root: as root, the cluster belongs to Debian's ``postgres`` user and its
    programs run as that user. ``restart`` stops it (``immediate``: a crash, as far as transactions go) and
    starts it again on the same port and data.
    """

    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="delay-broker-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.directory, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://delay_broker@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str, timeout: float = 120.0) -> None:
        subprocess.run(
            [*self._as_user, str(self.bindir / program), *args],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
            start_new_session=True,
        )

    def start(self) -> PostgresServer:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "delay_broker", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -c fsync=off"
        self._run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.log), "-o", options)
        return self

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data))

    def restart(self) -> None:
        self.stop("immediate")
        self.start()

    def close(self) -> None:
        try:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.stop("immediate")
            pid_file = self.data / "postmaster.pid"
            if pid_file.exists():  # pg_ctl could not stop it: the postmaster's process group goes
                with contextlib.suppress(ValueError, OSError):
                    os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def _wait(ready: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} was not ready within {timeout:.0f} s")
        time.sleep(0.2)
