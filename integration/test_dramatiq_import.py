"""Turning delay_broker on for a Dramatiq app that already has delayed messages, on RedisBroker and RabbitMQ.

A producer without the middleware (plain Dramatiq) fills three queues' delay queues (``<queue>.DQ``), then:
``delay-broker import`` (a real subprocess) moves the first queue's messages after a dry run that changes nothing;
an import of the second queue is killed with SIGKILL midway and run again; and a real ``dramatiq`` worker with the
middleware, started last, receives the third queue's messages and parks them instead of holding them. Every
message runs once, at or after its due time. The threshold is 2 s; messages are due 12 to 20 s after they are sent.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis

from delay_broker.embedded import EmbeddedRedis
from tests.helpers import wait_for as shared_wait_for

from .dramatiq_apps.app import App, Recorder, build, declare_actors, make_broker

ROOT = Path(__file__).resolve().parent.parent
wait_for = functools.partial(shared_wait_for, interval=0.1)
THRESHOLD = 2.0


@dataclass
class Setup:
    kind: str
    env: dict[str, str]
    app: App
    plain: dramatiq.Broker
    records: redis.Redis
    log: Path
    rabbitmq: Any = None
    worker: subprocess.Popen[bytes] | None = None

    def queue(self, name: str) -> str:
        return f"{name}_{self.env['DB_BROKER_NS']}"

    def send(self, name: str, token: str, delay: int) -> dramatiq.Message[Any]:
        """Sent by plain Dramatiq: the message waits in ``<queue>.DQ`` with an eta."""
        actor = self.plain.get_actor(f"record_{self.queue(name)}")
        message: dramatiq.Message[Any] = actor.send_with_options(args=(token,), delay=delay)
        return message

    def in_delay_queue(self, name: str) -> tuple[int, int]:
        """Messages of the queue's ``.DQ`` waiting in the broker, and held by workers (fetched, unacknowledged)."""
        queue = f"{self.queue(name)}.DQ"
        if self.kind == "redis":
            client: Any = self.app.broker.client  # type: ignore[attr-defined]
            key = f"{self.env['DB_BROKER_NS']}:{queue}"
            waiting = int(client.llen(key)) + int(client.llen(f"delay_broker:import:{key}"))
            return waiting, int(client.hlen(f"{key}.msgs")) - waiting
        return self.rabbitmq.queue_counts().get(queue, (0, 0))  # type: ignore[no-any-return]

    def runs(self) -> Counter[str]:
        events = [json.loads(raw) for raw in self.records.lrange(self.env["DB_RECORD_KEY"], 0, -1)]
        return Counter(event["id"] for event in events if event["event"] == "run")

    def run_times(self) -> dict[str, int]:
        events = [json.loads(raw) for raw in self.records.lrange(self.env["DB_RECORD_KEY"], 0, -1)]
        return {event["id"]: event["t"] for event in events if event["event"] == "run"}


@pytest.fixture(params=["redis", "rabbitmq"])
def setup(request: pytest.FixtureRequest, redis_server: EmbeddedRedis) -> Iterator[Setup]:
    kind: str = request.param
    unique = uuid.uuid4().hex[:10]
    env = {
        "DB_BROKER": kind,
        "DB_REDIS_URL": redis_server.url,
        "DB_BROKER_NS": f"im{unique}",
        "DB_STORE_NS": f"import-{kind}-{unique}",
        "DB_THRESHOLD": str(THRESHOLD),
        "DB_RECORD_KEY": f"records:import:{unique}",
    }
    env["DB_QUEUES"] = ",".join(f"{name}_{env['DB_BROKER_NS']}" for name in ("imp", "kill", "recv"))
    rabbitmq = None
    if kind == "rabbitmq":
        rabbitmq = request.getfixturevalue("rabbitmq")
        env["DB_RABBIT_URL"] = rabbitmq.pika_url
    plain = make_broker(env)  # no DelayMiddleware: the producer of an app before delay_broker
    record = Recorder(env["DB_REDIS_URL"], env["DB_RECORD_KEY"])
    for queue in env["DB_QUEUES"].split(","):
        declare_actors(plain, queue, record)
    log = Path(tempfile.mkstemp(prefix=f"delay-broker-import-{kind}-", suffix=".log")[1])
    setup = Setup(kind, env, build(env), plain, redis.Redis.from_url(redis_server.url), log, rabbitmq)
    try:
        yield setup
    finally:
        if setup.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(setup.worker.pid, signal.SIGTERM)
            setup.worker.wait(30)
        setup.app.broker.flush_all()  # the queues, and what is parked for them
        plain.close()
        setup.app.broker.close()
        setup.records.delete(env["DB_RECORD_KEY"])
        setup.records.close()
        log.unlink(missing_ok=True)


def start_import(setup: Setup, *args: str, slow: float | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, **setup.env, "PYTHONPATH": str(ROOT)}
    if slow is not None:
        env["DB_SLOW_IMPORT"] = str(slow)
    command = [sys.executable, "-c", "from delay_broker.cli import main; main()", "import"]
    return subprocess.Popen(
        [*command, "--dramatiq", "integration.dramatiq_apps.app:broker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_import(setup: Setup, *args: str) -> dict[str, dict[str, Any]]:
    """``delay-broker import ... --json``: its report by queue."""
    process = start_import(setup, *args, "--json")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, f"import failed ({process.returncode}):\n{out}\n{err}"
    return {queue["queue"]: queue for queue in json.loads(out)["queues"]}


def start_worker(setup: Setup) -> None:
    """One ``dramatiq`` worker process (two threads) with the middleware; its output goes to ``setup.log``."""
    command = [sys.executable, "-m", "dramatiq", "integration.dramatiq_apps.app:broker"]
    with open(setup.log, "ab") as output:
        setup.worker = subprocess.Popen(
            [*command, "--processes", "1", "--threads", "2"],
            cwd=ROOT,
            env={**os.environ, **setup.env, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.timeout(300)
def test_delays_sent_before_delay_broker_are_imported_or_parked_on_receipt_and_each_runs_once(setup: Setup) -> None:
    middleware = setup.app.middleware
    store = middleware.store
    imp, kill = setup.queue("imp"), setup.queue("kill")

    # 1. An import, after a dry run that changes nothing.
    imported = [setup.send("imp", f"imp-{n}", 20_000) for n in range(150)]
    soon = [setup.send("imp", f"soon-{n}", 1_000) for n in range(5)]  # due within the threshold: they stay
    dry = run_import(setup)
    assert (dry[f"{imp}.DQ"]["examined"], dry[f"{imp}.DQ"]["moved"]) == (155, 150)
    assert dry[f"{imp}.DQ"]["left"] == {"due within the threshold": 5}
    assert store.stats().parked == 0 and setup.in_delay_queue("imp")[0] == 155
    done = run_import(setup, "--yes")
    assert (done[f"{imp}.DQ"]["moved"], done[f"{imp}.DQ"]["already_parked"]) == (150, 0)
    assert store.stats().parked == 150 and setup.in_delay_queue("imp") == (5, 0)
    for message in imported:
        info = middleware.get(message.message_id)
        assert info is not None and info.due_ms == message.options["eta"]  # its own id and due time
        parked = middleware.parked_message(message.message_id)
        assert parked is not None and parked.queue_name == imp and "eta" not in parked.options

    # 2. An import killed midway (SIGKILL), then run again.
    killed = [setup.send("kill", f"kill-{n}", 20_000) for n in range(120)]
    process = start_import(setup, "--yes", "--queue", kill, "--batch", "10", slow=0.3)
    try:
        wait_for(lambda: store.stats().parked >= 150 + 20, 60, "the import parked some")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
    parked_before = sum(middleware.get(message.message_id) is not None for message in killed)
    assert 20 <= parked_before < 120, parked_before
    wait_for(lambda: setup.in_delay_queue("kill")[1] == 0, 30, "RabbitMQ requeued what the import held")
    assert sum(setup.in_delay_queue("kill")) + parked_before >= 120  # nothing lost (some may be in both)
    again = run_import(setup, "--yes", "--queue", kill)[f"{kill}.DQ"]
    print(f"\n{setup.kind}: killed after {parked_before} parked; the rerun found {again['already_parked']} parked")
    assert again["moved"] + parked_before == 120 and store.stats().parked == 270
    assert setup.in_delay_queue("kill") == (0, 0)

    # 3. A worker with the middleware receives plain delayed messages: it parks them, it holds none.
    received = [setup.send("recv", f"recv-{n}", 12_000) for n in range(40)]
    start_worker(setup)
    try:
        wait_for(lambda: all(middleware.get(m.message_id) for m in received), 60, "the worker parked what it got")
        wait_for(lambda: setup.in_delay_queue("recv") == (0, 0), 30, "nothing left in or held from recv.DQ")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{setup.log.read_text(errors='replace')[-4000:]}") from None
    assert store.stats().parked + store.stats().inflight >= 270 + 40 - len(setup.runs())

    # 4. Every message runs once, at or after its due time.
    sent = imported + soon + killed + received
    wait_for(lambda: len(setup.runs()) >= len(sent), 90, f"all {len(sent)} messages ran", interval=0.5)
    time.sleep(2.0)
    runs, times = setup.runs(), setup.run_times()
    assert [message.message_id for message in sent if runs[message.message_id] != 1] == []
    assert all(times[message.message_id] >= message.options["eta"] for message in sent)
    wait_for(lambda: (s := store.stats()).parked == s.inflight == 0, 15, "nothing left in the store")
