"""A producer process of the chaos run: ``python -m integration.chaos.producer COUNT SECONDS MIN MAX SEED PREFIX``.

Sends COUNT messages of the lane (environment as for the workers) evenly over SECONDS, each delayed between MIN
and MAX seconds, through the framework's own API. A send that raises (its store or broker is down, failing
over, restarting) is sent again, the same message, until it is acknowledged: a park of the same id replaces
what an earlier attempt may have stored, so a retry never duplicates. Acknowledged messages are recorded in
the results Redis; the last line on stdout is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping

import dramatiq
import redis

from .common import ENV_LANE, ENV_RESULTS_URL, ENV_RUN, now_ms, sent_key

RETRY_PAUSE_S = 0.2
GIVE_UP_S = 600.0
"""A send still refused after ten minutes is a broken run, not an outage."""

RETRY_FLOOR_MS = 3_000
"""A retry whose due time passed meanwhile is still parked (above the threshold), not sent at once: an
earlier attempt that was in fact stored is then replaced, never doubled. It runs late, never early."""

Prepare = Callable[[str, int], Callable[[int], object]]
"""prepare(id, due_ms) -> send(delay_ms): the message is built once, so every attempt sends the same one."""


def dramatiq_sender(env: Mapping[str, str]) -> Prepare:
    from .dramatiq_app import build

    broker, actor = build(env)

    def prepare(id: str, due_ms: int) -> Callable[[int], object]:
        # Our id as the message id: it is the park id too, so the run can tell which ids a promoter had leased.
        message = dramatiq.Message(
            queue_name=actor.queue_name,
            actor_name=actor.actor_name,
            args=(id, due_ms),
            kwargs={},
            options={},
            message_id=id,
        )
        return lambda delay_ms: broker.enqueue(message, delay=delay_ms)

    return prepare


def celery_sender(env: Mapping[str, str]) -> Prepare:
    from .celery_app import make_app

    task = make_app(env).tasks["chaos.run"]

    def prepare(id: str, due_ms: int) -> Callable[[int], object]:
        return lambda delay_ms: task.apply_async(args=(id, due_ms), task_id=id, countdown=delay_ms / 1000)

    return prepare


def send_until_acknowledged(send: Callable[[int], object], due_ms: int, refusals: Counter[str]) -> None:
    given_up_at = time.monotonic() + GIVE_UP_S
    delay_ms = due_ms - now_ms()
    while True:
        try:
            send(delay_ms)
            return
        except Exception as error:  # any refusal: the run's servers are being killed on purpose
            refusals[type(error).__name__] += 1
            if time.monotonic() > given_up_at:
                raise
            time.sleep(RETRY_PAUSE_S)
            delay_ms = max(due_ms - now_ms(), RETRY_FLOOR_MS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["dramatiq", "celery"])
    parser.add_argument("count", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("min_delay", type=float)
    parser.add_argument("max_delay", type=float)
    parser.add_argument("seed", type=int)
    parser.add_argument("prefix")
    options = parser.parse_args()
    env = os.environ
    prepare = dramatiq_sender(env) if options.framework == "dramatiq" else celery_sender(env)
    results = redis.Redis.from_url(env[ENV_RESULTS_URL])
    key = sent_key(env[ENV_RUN], env[ENV_LANE])
    rng = random.Random(options.seed)
    refusals: Counter[str] = Counter()
    acknowledged: list[str] = []
    print("ready", flush=True)
    started = time.monotonic()
    for n in range(options.count):
        ahead = started + options.seconds * n / options.count - time.monotonic()
        if ahead > 0:
            if acknowledged:
                results.rpush(key, *acknowledged)
                acknowledged.clear()
            time.sleep(ahead)
        id = f"{options.prefix}{n}"
        due_ms = now_ms() + int(rng.uniform(options.min_delay, options.max_delay) * 1000)
        send_until_acknowledged(prepare(id, due_ms), due_ms, refusals)
        acknowledged.append(f"{id} {due_ms}")
        if len(acknowledged) >= 500:
            results.rpush(key, *acknowledged)
            acknowledged.clear()
    if acknowledged:
        results.rpush(key, *acknowledged)
    summary = {"sent": options.count, "seconds": round(time.monotonic() - started, 1), "refusals": dict(refusals)}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
