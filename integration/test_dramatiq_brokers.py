"""DelayMiddleware end to end: real ``dramatiq`` worker processes on RedisBroker, RabbitmqBroker and SQSBroker.

For each broker one ``dramatiq`` invocation with two worker processes (each running the promoter thread)
serves every test of that broker; each test has queues of its own, and this process sends as a producer
only (it boots no worker, so it promotes nothing). Actors record each run in Redis (see
``dramatiq_apps/app.py``). The threshold is 1 s and the delays are a few seconds.
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
from datetime import timedelta
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis

from delay_broker.cron import occurrence_id
from delay_broker.embedded import EmbeddedRedis
from tests.helpers import wait_for as shared_wait_for

from .dramatiq_apps.app import LONG_RETRY_MS, App, build

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("parked", "packed", "month", "native", "retry", "longretry", "cancel", "load", "sqs6h", "toolarge")
THRESHOLD_MS = 1000
PACK_AFTER_MS = 10_000
# moto answers one call at a time: on SQS a quarter of the load shows the same and spares CI two minutes.
LOADS = {"redis": 2000, "rabbitmq": 2000, "sqs": 500}


def now_ms() -> int:
    return int(time.time() * 1000)


wait_for = functools.partial(shared_wait_for, interval=0.05)


@dataclass
class Deployment:
    """A broker, its running workers, and this process's producer-side app."""

    kind: str
    env: dict[str, str]
    app: App
    records: redis.Redis
    process: subprocess.Popen[bytes]
    log: Path

    def queue(self, scenario: str) -> str:
        return f"{scenario}_{self.env['DB_BROKER_NS']}"

    def actor(self, scenario: str, name: str = "record") -> dramatiq.Actor[Any, Any]:
        return self.app.actors[self.queue(scenario)][name]

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.records.lrange(self.env["DB_RECORD_KEY"], 0, -1)]

    def runs(self, token: str) -> list[dict[str, Any]]:
        return [event for event in self.events() if event["event"] == "run" and event["token"] == token]

    def held(self, message_id: str) -> bool:
        """Whether a worker ever held this message in memory for its eta (Dramatiq's native delay)."""
        return any(event["event"] == "held" and event["id"] == message_id for event in self.events())

    def in_broker(self, scenario: str) -> int:
        """Messages of the scenario's queue (and its .DQ) that sit in the broker itself."""
        queue = self.queue(scenario)
        broker: Any = self.app.broker
        if self.kind == "redis":
            ns = broker.namespace
            client = broker.client
            keys = (f"{ns}:{queue}", f"{ns}:{queue}.DQ")
            return sum(client.llen(key) + client.hlen(f"{key}.msgs") for key in keys)
        if self.kind == "rabbitmq":
            ready, delayed, _ = broker.get_queue_message_counts(queue)
            return int(ready + delayed)
        if hasattr(broker, "_ensure_queue"):  # dramatiq-sqs 0.4 on: the workers may not have created it yet
            broker._ensure_queue(queue)  # (before 0.4 declaring the actor created it)
        sqs_queue = broker.queues[queue]
        sqs_queue.load()
        names = ("", "Delayed", "NotVisible")
        return sum(int(sqs_queue.attributes[f"ApproximateNumberOfMessages{name}"]) for name in names)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


def start_workers(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as output:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dramatiq",
                "integration.dramatiq_apps.app:broker",
                "--processes",
                "2",
                "--threads",
                "4",
                "--worker-shutdown-timeout",
                "15000",
            ],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_workers(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


@pytest.fixture(scope="module", params=["redis", "rabbitmq", "sqs"])
def deployment(request: pytest.FixtureRequest, redis_server: EmbeddedRedis) -> Iterator[Deployment]:
    kind: str = request.param
    unique = uuid.uuid4().hex[:10]
    env = {
        "DB_BROKER": kind,
        "DB_REDIS_URL": redis_server.url,
        "DB_BROKER_NS": f"db{unique}",
        "DB_STORE_NS": f"dramatiq-{kind}-{unique}",
        "DB_THRESHOLD": str(THRESHOLD_MS / 1000),
        "DB_RECORD_KEY": f"records:{kind}:{unique}",
        # Messages 10 s or more ahead are packed (the month-long and 20-minute ones below too).
        "DB_PACK_AFTER": str(PACK_AFTER_MS / 1000),
    }
    env["DB_QUEUES"] = ",".join(f"{scenario}_{env['DB_BROKER_NS']}" for scenario in SCENARIOS)
    if kind == "rabbitmq":
        env["DB_RABBIT_URL"] = request.getfixturevalue("rabbitmq").pika_url
    if kind == "sqs":
        env["DB_SQS_ENDPOINT"] = request.getfixturevalue("sqs").endpoint_url
    yield from running(kind, env, redis_server.url)


def running(kind: str, env: dict[str, str], records_url: str) -> Iterator[Deployment]:
    """Build the producer-side app, start two worker processes, wait for them to boot; stop them after."""
    app = build(env)
    records = redis.Redis.from_url(records_url)
    log = Path(tempfile.mkstemp(prefix=f"delay-broker-dramatiq-{kind}-", suffix=".log")[1])
    process = start_workers(env, log)
    deployment = Deployment(kind, env, app, records, process, log)
    try:
        boots = lambda: sum(event["event"] == "boot" for event in deployment.events()) >= 2  # noqa: E731
        try:
            wait_for(boots, 90, "two worker processes booted")
        except AssertionError:
            raise AssertionError(f"workers did not boot:\n{deployment.tail()}") from None
        yield deployment
    finally:
        stop_workers(process)
        app.broker.close()
        records.delete(env["DB_RECORD_KEY"])
        records.close()
        log.unlink(missing_ok=True)


def assert_parked(deployment: Deployment, message: dramatiq.Message[Any], delay_ms: int, sent_at: int) -> int:
    info = deployment.app.middleware.get(message)
    assert info is not None and info.state == "due" and info.due_ms is not None
    assert sent_at + delay_ms <= info.due_ms <= now_ms() + delay_ms + 5
    return info.due_ms


def test_delay_above_threshold_is_parked_and_runs_once_after_due(deployment: Deployment) -> None:
    sent_at = now_ms()
    message = deployment.actor("parked").send_with_options(args=("parked",), delay=3000)
    due = assert_parked(deployment, message, 3000, sent_at)
    assert deployment.in_broker("parked") == 0  # nothing in the queue or its .DQ

    runs = wait_for(lambda: deployment.runs("parked"), 30, "the parked message ran")
    assert runs[0]["t"] >= due - 1 and runs[0]["id"] == message.message_id
    time.sleep(1.0)
    assert len(deployment.runs("parked")) == 1
    assert not deployment.held(message.message_id)  # no worker ever held it for an eta
    # At-least-once brokers: the promoter acknowledges after the publish, so the run may come first.
    wait_for(lambda: deployment.app.middleware.get(message) is None, 10, "the promotion acknowledged")


def test_a_packed_message_is_opened_in_time_and_runs_once_after_due(deployment: Deployment) -> None:
    store = deployment.app.middleware.store
    packed_before = store.stats().packed
    sent_at = now_ms()
    message = deployment.actor("packed").send_with_options(args=("packed",), delay=PACK_AFTER_MS + 2000)
    due = assert_parked(deployment, message, PACK_AFTER_MS + 2000, sent_at)
    assert store.stats().packed == packed_before + 1
    runs = wait_for(lambda: deployment.runs("packed"), 40, "the packed message ran")
    assert runs[0]["t"] >= due - 1 and runs[0]["id"] == message.message_id
    time.sleep(1.0)
    assert len(deployment.runs("packed")) == 1 and store.stats().packed == packed_before
    assert not deployment.held(message.message_id)


def test_thirty_days_parked_then_rescheduled_to_now_runs_once(deployment: Deployment) -> None:
    middleware = deployment.app.middleware
    sent_at = now_ms()
    message = deployment.actor("month").send_with_options(args=("month",), delay=timedelta(days=30))
    assert_parked(deployment, message, 30 * 86_400_000, sent_at)
    assert deployment.in_broker("month") == 0
    assert middleware.reschedule(message, delay=0) is not None
    wait_for(lambda: deployment.runs("month"), 30, "the rescheduled message ran")
    time.sleep(1.0)
    assert len(deployment.runs("month")) == 1
    assert not deployment.held(message.message_id)


def test_delay_below_threshold_takes_the_native_path(deployment: Deployment) -> None:
    message = deployment.actor("native").send_with_options(args=("native",), delay=500)
    assert deployment.app.middleware.get(message) is None
    wait_for(lambda: deployment.runs("native"), 30, "the natively delayed message ran")
    time.sleep(0.5)
    assert len(deployment.runs("native")) == 1
    # Redis and RabbitMQ delay natively in worker memory (.DQ + eta); SQS with DelaySeconds on the server.
    assert deployment.held(message.message_id) == (deployment.kind != "sqs")


def test_retry_backoff_above_threshold_is_parked_and_the_retry_runs(deployment: Deployment) -> None:
    middleware = deployment.app.middleware
    message = deployment.actor("retry", "flaky").send("retry")

    def parked() -> Any:
        info = middleware.get(message)
        return info if info is not None and info.state == "due" else None

    info = wait_for(parked, 30, "the retry was parked")
    # Retries parks the retry before the worker acknowledges the failed attempt, which then leaves the broker.
    wait_for(lambda: deployment.in_broker("retry") == 0, 10, "the failed attempt acknowledged")
    runs = wait_for(lambda: len(deployment.runs("retry")) == 2 and deployment.runs("retry"), 30, "the retry ran")
    assert [run["retries"] for run in runs] == [0, 1]
    assert runs[1]["t"] >= info.due_ms - 1
    assert not deployment.held(message.message_id)


def test_retry_longer_than_fifteen_minutes_is_kept(deployment: Deployment) -> None:
    """``Retry(delay=20 min)``: dramatiq-sqs alone raises inside Retries, which is swallowed, and loses it."""
    middleware = deployment.app.middleware
    message = deployment.actor("longretry", "retry_long").send("longretry")
    wait_for(lambda: deployment.runs("longretry"), 30, "the first attempt ran")
    info = wait_for(lambda: middleware.get(message), 30, "the 20-minute retry was parked")
    assert info.state == "due" and info.due_ms > now_ms() + LONG_RETRY_MS - 60_000
    assert middleware.reschedule(message, delay=0) is not None
    runs = wait_for(lambda: len(deployment.runs("longretry")) == 2 and deployment.runs("longretry"), 30, "retry ran")
    assert [run["retries"] for run in runs] == [0, 1]


def test_cancelled_before_due_never_runs(deployment: Deployment) -> None:
    actor = deployment.actor("cancel")
    message = actor.send_with_options(args=("cancelled",), delay=2000)
    assert deployment.app.middleware.cancel(message) is True
    actor.send_with_options(args=("sentinel",), delay=2000)  # due after the cancelled one would have been
    wait_for(lambda: deployment.runs("sentinel"), 30, "the sentinel ran")
    time.sleep(1.0)
    assert deployment.runs("cancelled") == []
    assert deployment.app.middleware.get(message) is None


@pytest.mark.timeout(900)  # the module's worker start-up counts too; the default 300 s is tight on 2 cores
def test_two_workers_promote_thousands_of_messages(deployment: Deployment, record_property: Any) -> None:
    """Two worker processes, each with its promoter thread, on 2,000 messages (SQS: 500) due within a few
    seconds."""
    store = deployment.app.middleware.store
    load = LOADS[deployment.kind]
    assert wait_for(lambda: store.stats().live_promoters >= 2, 30, "two live promoters")
    actor = deployment.actor("load")
    tokens = [f"load-{n}" for n in range(load)]
    started = time.monotonic()
    for n, token in enumerate(tokens):
        # Due 2 to 4 s after sending, spread evenly: above the 1 s threshold, all parked.
        actor.send_with_options(args=(token,), delay=2000 + (n * 2000) // load)
    sent = time.monotonic() - started
    assert store.stats().parked + store.stats().inflight > 0

    def all_ran() -> bool:
        return len({event["token"] for event in deployment.events() if event["event"] == "run"} & set(tokens)) == load

    wait_for(all_ran, 240 if deployment.kind == "sqs" else 150, f"all {load} messages ran", interval=0.5)
    time.sleep(2.0)
    counts = Counter(event["token"] for event in deployment.events() if event["event"] == "run")
    duplicates = sum(counts[token] - 1 for token in tokens)
    lost = sum(counts[token] == 0 for token in tokens)
    elapsed = time.monotonic() - started
    record_property("duplicates", duplicates)
    print(
        f"\n{deployment.kind}: {load} parked in {sent:.1f} s, all ran after {elapsed:.1f} s; "
        f"lost {lost}, duplicates {duplicates}; store counters {store.stats().counters}"
    )
    assert lost == 0
    if deployment.kind == "redis":
        assert duplicates == 0  # exactly-once hand-off, and no worker died
    settled = lambda: (s := store.stats()).parked == s.inflight == s.dead == 0  # noqa: E731
    wait_for(settled, 15, "nothing left parked, in flight or dead")


def test_six_hours_on_sqs_needs_the_middleware(deployment: Deployment) -> None:
    if deployment.kind != "sqs":
        pytest.skip("SQS only: the other brokers accept any delay natively")
    from dramatiq_sqs import SQSBroker

    env = deployment.env
    plain = SQSBroker(namespace=env["DB_BROKER_NS"], endpoint_url=env["DB_SQS_ENDPOINT"], region_name="us-east-1")
    queue = deployment.queue("sqs6h")
    bare = dramatiq.actor(broker=plain, queue_name=queue, actor_name=f"bare_{queue}")(lambda token: None)
    with pytest.raises(ValueError):  # MessageDelayTooLong from dramatiq-sqs 0.4.1 on, a plain ValueError before
        bare.send_with_options(args=("without",), delay=timedelta(hours=6))
    plain.close()

    sent_at = now_ms()
    message = deployment.actor("sqs6h").send_with_options(args=("with",), delay=timedelta(hours=6))
    assert_parked(deployment, message, 6 * 3_600_000, sent_at)
    assert deployment.in_broker("sqs6h") == 0
    deployment.app.middleware.reschedule(message, delay=0)
    runs = wait_for(lambda: deployment.runs("with"), 30, "the 6-hour message ran when rescheduled")
    assert runs[0]["id"] == message.message_id
    assert deployment.runs("without") == []


def test_a_message_sqs_would_refuse_is_refused_when_sent_not_dead_lettered_when_due(deployment: Deployment) -> None:
    """The park refuses what the installed dramatiq-sqs's own ``enqueue`` refuses, with the same exception and at
    the same limit: 1 MiB once base64-encoded and ``MessageTooLarge`` now, 256 KiB and a RuntimeError in 0.2."""
    if deployment.kind != "sqs":
        pytest.skip("SQS only: dramatiq-sqs refuses messages over its size limit once base64-encoded")
    from dramatiq_sqs import SQSBroker

    env = deployment.env
    # A namespace of its own: what the plain broker accepts lands in a queue no worker reads.
    plain = SQSBroker(namespace=f"{env['DB_BROKER_NS']}x", endpoint_url=env["DB_SQS_ENDPOINT"], region_name="us-east-1")
    queue = deployment.queue("toolarge")
    bare = dramatiq.actor(broker=plain, queue_name=queue, actor_name=f"bare_{queue}")(lambda token: None)
    middleware = deployment.app.middleware
    try:
        # 900 kB of arguments (1.2 MB once base64-encoded) is over every version's limit; 300 kB (400 kB) only
        # over dramatiq-sqs 0.2's.
        for size in (900_000, 300_000):
            try:
                bare.send("x" * size)
            except Exception as error:  # whatever this version raises is what the park must raise
                refused: type[Exception] | None = type(error)
            else:
                refused = None
            parked_before = middleware.store.stats().parked
            if refused is None:
                message = deployment.actor("toolarge").send_with_options(args=("x" * size,), delay=timedelta(hours=6))
                assert middleware.cancel(message)
                continue
            with pytest.raises(refused) as caught:
                deployment.actor("toolarge").send_with_options(args=("x" * size,), delay=timedelta(hours=6))
            assert type(caught.value) is refused, f"{size}: {caught.value!r}"
            assert middleware.store.stats().parked == parked_before
    finally:
        plain.close()


def test_standalone_promoter_command(deployment: Deployment) -> None:
    """``delay-broker promote --dramatiq module:broker`` promotes a namespace no worker promotes."""
    env = {**deployment.env, "DB_STORE_NS": f"{deployment.env['DB_STORE_NS']}-cli"}
    producer = build(env)
    try:
        message = producer.actors[deployment.queue("parked")]["record"].send_with_options(args=("cli",), delay=1500)
        assert producer.middleware.get(message) is not None
        time.sleep(2.5)
        assert deployment.runs("cli") == []  # the workers' promoters serve another namespace
        process = start_promoter(deployment, env)
        try:
            try:
                runs = wait_for(lambda: deployment.runs("cli"), 60, "the standalone promoter delivered")
            except AssertionError as error:
                raise AssertionError(f"{error}\n{deployment.tail()}") from None
            assert runs[0]["id"] == message.message_id
        finally:
            stop_promoter(deployment, process)
        assert producer.middleware.get(message) is None
    finally:
        producer.broker.close()


def start_promoter(deployment: Deployment, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``delay-broker promote --dramatiq`` on the deployment's app, with ``env`` for its settings."""
    command = [sys.executable, "-c", "from delay_broker.cli import main; main()", "promote", "--dramatiq"]
    with open(deployment.log, "ab") as output:
        return subprocess.Popen(
            [*command, "integration.dramatiq_apps.app:broker", "--max-idle", "1"],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_promoter(deployment: Deployment, process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    code = process.wait(30)
    assert code == 0, f"the promoter did not stop gracefully ({code}):\n{deployment.tail()}"


def test_a_schedule_shared_by_two_promoters_runs_each_occurrence_once(deployment: Deployment) -> None:
    """``DelayMiddleware.schedule``: two promoter processes know the schedule; workers run every occurrence
    once, after its due time, with the id every process derives for it."""
    namespace = f"{deployment.env['DB_STORE_NS']}-cron"
    env = {**deployment.env, "DB_STORE_NS": namespace, "DB_SCHEDULE": "* * * * * */2"}
    started = now_ms()
    promoters = [start_promoter(deployment, env) for _ in range(2)]
    try:
        try:
            wait_for(lambda: len(deployment.runs("cron")) >= 4, 60, "four occurrences ran")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{deployment.tail()}") from None
    finally:
        for process in promoters:
            stop_promoter(deployment, process)
    time.sleep(1.0)
    producer = build({**env, "DB_SCHEDULE": ""})
    store = producer.middleware.store
    runs = deployment.runs("cron")
    ids = [run["id"] for run in runs]
    assert len(ids) == len(set(ids)), f"an occurrence ran twice: {Counter(ids).most_common(2)}"
    for run in runs:
        # Its due time is the even second it ran in (or the one before, if it ran late).
        due = run["t"] // 2000 * 2000
        assert run["id"] in {occurrence_id(namespace, "tick", due), occurrence_id(namespace, "tick", due - 2000)}
        assert run["t"] >= started
    # The next occurrence waits in the store, and the schedule's record shows it.
    latest = store.schedules()["tick"]
    assert latest is not None and latest > max(run["t"] for run in runs)
    info = store.get(occurrence_id(namespace, "tick", latest))
    producer.broker.close()
    assert info is not None and info.state == "due"
