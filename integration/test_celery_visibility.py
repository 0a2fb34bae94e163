"""The visibility-timeout duplicate on Celery's Redis transport, with and without delay_broker.

Plain Celery keeps an ETA task unacknowledged in the worker; once ``visibility_timeout`` passes, kombu
restores it to the queue and the worker receives (and later runs) it again. Parked, no worker holds it.
"""

from __future__ import annotations

import time
import uuid

import pytest

from .celery_apps.brokers import env_for
from .celery_apps.harness import wait_for

VISIBILITY = {"visibility_timeout": 2, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
COUNTDOWN = 8


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain-celery", "delay-broker"])
def test_visibility_timeout_duplicates(request: pytest.FixtureRequest, wrapped: bool) -> None:
    env = env_for("redis", request, uuid.uuid4().hex[:10], transport_options=VISIBILITY, wrapped=wrapped)
    try:
        env.start_worker("w1")
        result = env.task("record").apply_async(("eta",), countdown=COUNTDOWN)
        wait_for(lambda: env.runs(result.id), COUNTDOWN + 20, what="task ran")
        time.sleep(4)  # restored copies held by the worker run at the same eta, or shortly after
        runs = len(env.runs(result.id))
        if wrapped:
            assert runs == 1, f"delay_broker: expected exactly one run, got {runs}"
        else:
            assert runs > 1, f"plain Celery was expected to run the task more than once, got {runs}"
    finally:
        env.close()
