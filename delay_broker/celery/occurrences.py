"""What a promoter needs of an app's recurring schedules: those declared in code, and each occurrence's message.

An occurrence's message is made by Celery itself (``app.send_task`` with ``eta=`` the occurrence), caught by the
delay_broker transport before it is sent (:func:`~delay_broker.celery.parking.capture_parked`), so it carries
exactly what a task sent by hand would: routing, headers, serializer, options. Declaring a schedule is
:func:`delay_broker.celery.schedule`'s.
"""

from __future__ import annotations

import weakref
from datetime import datetime, timedelta
from typing import Any

from ..cron import Build, Schedule
from ..envelope import Envelope
from ..errors import ConfigurationError, DelayBrokerError
from ..schedule_defs import ScheduledCall
from .parking import capture_parked

_registry: weakref.WeakKeyDictionary[Any, dict[str, Schedule]] = weakref.WeakKeyDictionary()


def declare(app: Any, schedule: Schedule) -> None:
    """Add a schedule declared in code to ``app``'s; its name must be new."""
    schedules = _registry.setdefault(app, {})
    if schedule.name in schedules:
        raise ConfigurationError(f"there is already a schedule named {schedule.name!r}: give this one a name")
    schedules[schedule.name] = schedule


def schedules_of(app: Any) -> dict[str, Schedule]:
    """The recurring schedules declared for ``app``, by name."""
    return dict(_registry.get(app, {}))


def occurrence_builder(app: Any, call: ScheduledCall) -> Build:
    """Makes each occurrence's message with Celery itself (``send_task`` with the occurrence's id and eta)."""

    def build(id: str, due: datetime) -> Envelope:
        options = dict(call.options)
        expires = _expires_at(app, call, due)
        if expires is not None:
            options["expires"] = expires
        with capture_parked() as captured:
            app.send_task(call.task, args=call.args, kwargs=dict(call.kwargs), task_id=id, eta=due, **options)
        if len(captured) != 1:
            raise DelayBrokerError(
                f"the occurrence of {call.task!r} was not caught by a delay_broker transport: is it enabled?"
            )
        return captured[0]

    return build


def _expires_at(app: Any, call: ScheduledCall, due: datetime) -> datetime | None:
    """A relative ``expires`` (seconds or a timedelta, the call's or else its task's) as the time it ends,
    counted from the occurrence: Celery counts it from the send, which for an occurrence is its build, a period
    ahead, so every occurrence would expire before it is due (beat sends at the due time)."""
    expires = (
        call.options["expires"] if "expires" in call.options else getattr(app.tasks.get(call.task), "expires", None)
    )
    if isinstance(expires, timedelta):
        return due + expires
    if isinstance(expires, int | float) and not isinstance(expires, bool):
        return due + timedelta(seconds=expires)
    return None  # none, or already a point in time
