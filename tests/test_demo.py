"""The demo command runs end to end on a private redis-server it starts itself."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

from delay_broker.embedded import free_port, redis_executable
from tests.helpers import wait_for


def run_demo(*args: str, private: bool = True) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", "from delay_broker.cli import main; main()", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("private redis-server" in " ".join(result.stdout.split())) == private
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) >= 2:
            rows[cells[0]] = cells[1:]
    return rows


def test_dramatiq_demo_runs_every_message_once_with_and_without_delay_broker():
    rows = run_demo("--messages", "300", "--seconds", "1", "--max-delay", "3")
    assert rows["executed"] == ["300", "300"]
    assert rows["duplicates"][0] == "0" and rows["lost"][0] == "0"
    assert rows["worker memory growth"][0].endswith("MB")


def test_the_demo_on_a_given_redis_removes_what_it_wrote(redis_server, client):
    def demo_keys() -> list[bytes]:
        return [key for key in client.scan_iter() if b"demo-" in key]

    assert demo_keys() == []
    rows = run_demo(
        "--redis-url", redis_server.url, "--messages", "50", "--seconds", "0.5", "--max-delay", "2.5", private=False
    )
    assert rows["executed"] == ["50", "50"]
    assert demo_keys() == []


def test_lists_demo_parks_promotes_and_counts_no_duplicates_or_losses():
    rows = run_demo("--lists", "--messages", "500", "--seconds", "2")
    assert rows["parked"] == ["500"] and rows["received by the worker"] == ["500"]
    assert rows["duplicates"] == ["0"] and rows["lost"] == ["0"]


def test_a_redis_server_outside_the_virtualenv_is_preferred(tmp_path, monkeypatch):
    # The dev extra puts Redis 6.2 into the virtualenv's bin; an activated virtualenv must not hide the system's.
    venv, system = tmp_path / "venv", tmp_path / "system"
    for directory in (venv / "bin", system):
        directory.mkdir(parents=True)
        (directory / "redis-server").write_text("#!/bin/sh\n")
        (directory / "redis-server").chmod(0o755)
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setenv("PATH", f"{venv / 'bin'}{os.pathsep}{system}")
    assert redis_executable() == str(system / "redis-server")
    monkeypatch.setenv("PATH", str(venv / "bin"))
    assert redis_executable() == str(venv / "bin" / "redis-server"), "the virtualenv's own is used when alone"


def test_private_servers_listen_below_the_ports_clients_are_given():
    """A server restarted on its port must not find it taken by some client's outgoing connection meanwhile."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        ephemeral = int(ranges.read().split()[0])
    assert all(free_port() < ephemeral for _ in range(20)) or ephemeral <= 12_000


def test_a_private_redis_server_dies_with_the_process_that_started_it():
    # SIGKILL runs no clean-up: without the kernel's help the server would hold its port and directory for good.
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nfrom delay_broker.embedded import EmbeddedRedis\nserver = EmbeddedRedis().start()\n"
            "print(server.process.pid, server.directory, flush=True)\ntime.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    pid, directory = owner.stdout.readline().split()
    try:
        owner.kill()
        owner.wait(10)
        wait_for(lambda: not _alive(int(pid)), 10, "redis-server outlived the process that started it")
    finally:
        if _alive(int(pid)):
            os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited, its parent gone
    except FileNotFoundError:
        return False


def test_a_negative_duration_is_a_usage_error_not_a_traceback():
    result = subprocess.run(
        [sys.executable, "-c", "from delay_broker.cli import main; main()", "demo", "--lists", "--seconds", "-3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Invalid value for '--seconds'" in result.stderr, result.stderr
