"""``delay-broker web`` starting up against a real redis-server: Redis checked and the port bound before the URL
is printed, a network address refused without authentication, secrets never taken on the command line, and a
startup log that says how the dashboard is protected. The browser-side attacks are in
integration/test_dashboard_security.py."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from delay_broker.cli import cli
from delay_broker.embedded import EmbeddedRedis, free_port

from .web_helpers import DASHBOARD_ENV, WebCommand, get


@pytest.fixture
def run(redis_server: EmbeddedRedis, namespace: str) -> Any:
    """``delay-broker web ARGS`` in-process, for what ends before serving (refusals and failures)."""

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        environment: dict[str, str | None] = {name: None for name in DASHBOARD_ENV}
        environment.update({"DELAY_BROKER_REDIS_URL": redis_server.url, "DELAY_BROKER_NAMESPACE": namespace})
        environment.update(env or {})
        return CliRunner().invoke(cli, ["web", *args], env=environment, catch_exceptions=False)

    return invoke


@pytest.fixture
def serve(redis_server: EmbeddedRedis, namespace: str) -> Iterator[Any]:
    started: list[WebCommand] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WebCommand:
        started.append(WebCommand(redis_server.url, namespace, *args, env=env))
        return started[-1]

    yield start
    for served in started:
        served.stop()


def test_the_url_is_printed_once_redis_answered_and_the_port_is_bound(serve: Any) -> None:
    served = serve()
    assert get(served.url + "/") == 200, "the first request, made the moment the URL was printed, is answered"
    log = served.stop()
    assert served.first_line.startswith("delay_broker dashboard for namespace")
    assert "authentication: none (loopback only" in log
    assert f"answers to Host: 127.0.0.1:{served.url.rsplit(':', 1)[1]}" in log
    assert "session and form secret: generated for this process (set DELAY_BROKER_WEB_SECRET" in log


def test_an_unreachable_redis_fails_before_anything_is_bound_or_printed(run: Any) -> None:
    port = free_port()
    result = run("--port", str(port), env={"DELAY_BROKER_REDIS_URL": f"redis://:hunter2@127.0.0.1:{free_port()}/0"})
    assert result.exit_code == 1
    assert "cannot reach Redis at redis://:***@127.0.0.1:" in result.output and "hunter2" not in result.output
    assert "dashboard for namespace" not in result.output and "http://" not in result.output
    with socket.create_server(("127.0.0.1", port)):
        pass  # the port was never taken


def test_a_taken_port_fails_before_the_url_is_printed(run: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run("--port", str(port))
    assert result.exit_code == 1
    assert f"could not serve on 127.0.0.1:{port}" in result.output and "in use" in result.output
    assert "dashboard for namespace" not in result.output


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_a_network_address_without_authentication_is_refused(run: Any, host: str) -> None:
    for extra in ([], ["--read-only"]):
        result = run("--host", host, *extra)
        assert result.exit_code == 2, result.output
        assert f"refusing to serve the dashboard on {host} without authentication" in result.output
        assert "DELAY_BROKER_WEB_PASSWORD" in result.output and "--allow-unauthenticated" in result.output


@pytest.mark.parametrize("option", ["--password", "--token", "--secret"])
def test_no_secret_is_taken_on_the_command_line(run: Any, option: str) -> None:
    result = run(option, "visible-in-ps")
    assert result.exit_code == 2 and "No such option" in result.output


def test_bad_security_settings_are_usage_errors(run: Any, tmp_path: Path) -> None:
    empty, short = tmp_path / "empty", tmp_path / "short"
    empty.write_text("")
    short.write_text("short\n")
    cases = [
        (["--password-file", str(empty)], {}, "password file"),
        (["--token-file", str(empty)], {"DELAY_BROKER_WEB_TOKEN": "t"}, "both DELAY_BROKER_WEB_TOKEN and a token file"),
        (["--secret-file", str(short)], {}, "too short"),
        ([], {"DELAY_BROKER_WEB_SECRET": "short"}, "too short"),
        (["--allowed-host", "http://dash"], {}, "not a host name"),
        (["--trusted-origin", "dash.example.com"], {}, "not an origin"),
        (["--user", "a:b"], {"DELAY_BROKER_WEB_PASSWORD": "pw"}, "no colon"),
    ]
    for args, env, message in cases:
        result = run(*args, env=env)
        assert result.exit_code == 2 and message in result.output, (args, result.output)


def test_a_network_address_with_a_password_asks_for_it(serve: Any, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("correct horse\n")
    served = serve("--host", "0.0.0.0", "--password-file", str(password), env={"DELAY_BROKER_WEB_SECRET": "s" * 20})
    local = served.url.replace("//127.0.0.1:", "//localhost:")
    assert get(local + "/") == 401
    assert get(local + "/", {"Authorization": "Basic YWRtaW46Y29ycmVjdCBob3JzZQ=="}) == 200  # admin:correct horse
    log = served.stop()
    assert "authentication: basic auth as user 'admin'" in log and "plain HTTP" in log
    assert f"session and form secret: from DELAY_BROKER_WEB_SECRET{os.linesep}" in log
