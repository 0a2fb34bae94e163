"""What a person at a terminal gets from ``delay-broker``: ids whole at 100 and 120 columns (to copy them into
show or cancel), paging by cursor, usage errors for bad options, the URL and the task named when Redis cannot
be reached, a hint when a namespace holds nothing (the wrong one, most likely), and no minute-long wait for a
payload nested thousands deep."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from delay_broker import DelayStore
from delay_broker.cli import cli, common
from delay_broker.decoding import MAX_JSON_DEPTH, decode_payload
from delay_broker.embedded import EmbeddedRedis

from .helpers import celery_envelope, dramatiq_envelope


@pytest.fixture
def run(redis_server: EmbeddedRedis, namespace: str) -> Any:
    def invoke(*args: str) -> Any:
        env = {"DELAY_BROKER_REDIS_URL": redis_server.url, "DELAY_BROKER_NAMESPACE": namespace}
        return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)

    return invoke


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("width", [100, 120])
@pytest.mark.parametrize("state", ["due", "dead"])
def test_message_ids_are_never_wrapped_at_100_and_120_columns(run, store: DelayStore, monkeypatch, width, state):
    monkeypatch.setattr(common, "make_console", lambda: Console(highlight=False, width=width))
    ids = [str(uuid.uuid4()) for _ in range(4)]
    # Long queue and task names, both frameworks (the widest table): those columns wrap, the ids do not.
    for n, id in enumerate(ids):
        make = dramatiq_envelope if n % 2 else celery_envelope
        store.park(id, make("reports.generate_the_monthly_report_for_every_customer", id, queue="reports_lo"), delay=0)
    if state == "dead":
        claimed = store.claim(10, 60, "terminal-test")
        store.nack(
            claimed.lease_deadline_ms,
            [(m.id, "no queue 'reports_lo' in this app " * 3, "dead") for m in claimed.messages],
        )
    result = run("ls", state)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    for id in ids:
        assert sum(id in line for line in lines) == 1, f"{id} is not whole on one line:\n{result.output}"
    shown = [line.split()[0] for line in lines if line[:8] in {id[:8] for id in ids}]
    assert sorted(shown) == sorted(ids)


def test_the_next_page_s_cursor_is_alone_on_the_last_line(run, store: DelayStore, monkeypatch):
    monkeypatch.setattr(common, "make_console", lambda: Console(highlight=False, width=100))
    for n in range(3):
        store.park(str(uuid.uuid4()), dramatiq_envelope("send_email", f"m{n}"), delay=60 + n)
    last = run("ls", "--limit", "2", "--queue", "default").output.splitlines()[-1]
    assert last.startswith("Next page: --cursor ")
    cursor = last.removeprefix("Next page: --cursor ")
    assert " " not in cursor and not cursor.endswith(".")
    rest = run("ls", "--cursor", cursor, "--limit", "2", "--queue", "default")
    assert rest.exit_code == 0 and "Showing 1 matching" in rest.output


def test_ls_help_recommends_the_cursor_for_the_next_page(run):
    help_text = run("ls", "--help").output
    example = next(line for line in help_text.splitlines() if "the next page" in line)
    assert "--cursor" in example and "--offset" not in example
    offset_help = help_text.split("--offset", 1)[1].split("--limit", 1)[0]
    assert "--cursor" in " ".join(offset_help.split())


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--dramatiq", "X", "expected MODULE:NAME"),
        ("--dramatiq", "no_such_module_here:broker", "cannot import 'no_such_module_here'"),
        ("--celery", "os:no_such_attribute", "'os' has no attribute 'no_such_attribute'"),
    ],
)
def test_promote_given_an_app_that_is_not_there_is_a_usage_error(option, value, said):
    result = CliRunner().invoke(cli, ["promote", option, value])
    assert result.exit_code == 2, result.output
    assert said in result.output and f"Invalid value for '{option}'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "doing"),
    [
        (["stats"], "while reading the store's counts"),
        (["ls"], "while listing messages"),
        (["dead", "ls"], "while listing dead-lettered messages"),
        (["cancel", "some-id", "--yes"], "while cancelling"),
        (["cron", "ls"], "while listing recurring schedules"),
    ],
)
def test_an_unreachable_redis_is_named_with_its_password_masked(args, doing):
    url = f"redis://operator:s3cret-pw@127.0.0.1:{closed_port()}/2"
    result = CliRunner().invoke(cli, [*args, "--redis-url", url], catch_exceptions=False)
    assert result.exit_code == 1
    message = result.output.strip()
    assert message.startswith(f"Error: cannot reach Redis at redis://operator:***@127.0.0.1:{url.split(':')[-1]}")
    assert doing in message and "Connection refused" in message and "--redis-url" in message
    assert "s3cret" not in message and "shard layout" not in message and "Traceback" not in message


def test_an_unreachable_sentinel_url_is_masked_too():
    url = f"redis+sentinel://:pw1@127.0.0.1:{closed_port()}/mymaster/0?sentinel_password=pw2"
    result = CliRunner().invoke(cli, ["stats", "--redis-url", url], catch_exceptions=False)
    assert result.exit_code == 1
    assert "pw1" not in result.output and "pw2" not in result.output
    assert "redis+sentinel://:***@" in result.output and "sentinel_password=***" in result.output


def test_a_namespace_that_holds_nothing_says_what_to_check(run, store: DelayStore, namespace):
    for args in (["stats"], ["ls"], ["dead", "ls"]):
        output = " ".join(run(*args, "--namespace", "not-the-apps").output.split())
        assert "Namespace 'not-the-apps' holds nothing" in output
        assert "check --namespace" in output and "--redis-url" in output
    store.park("one", dramatiq_envelope("send_email", "one"), delay=3600)
    store.cancel("one")  # nothing left, but it was used: its counters say so, and zeros are true
    for args in (["stats"], ["ls"]):
        assert "holds nothing" not in run(*args).output


@pytest.mark.parametrize(
    ("depth", "shown_as"), [(MAX_JSON_DEPTH, "json"), (MAX_JSON_DEPTH + 1, "text"), (5000, "text")]
)
def test_json_nested_deeper_than_any_message_is_shown_as_text_on_every_python(depth, shown_as):
    """Python 3.12+ decodes JSON nested 5,000 deep, which 3.11 refused; indented, it made `show` print for a
    minute (each level indents all below it). Past MAX_JSON_DEPTH it is the text it is, whatever the Python."""
    deep = b"[" * depth + b'"x"' + b"]" * depth
    assert decode_payload("dramatiq", deep)["format"] == shown_as
    celery = json.dumps({"body": base64.b64encode(deep).decode(), "properties": {"body_encoding": "base64"}})
    assert decode_payload("celery", celery.encode())["body"]["format"] == shown_as
