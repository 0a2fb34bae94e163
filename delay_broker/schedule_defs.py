"""What a runtime schedule is, as stored in Redis: a JSON definition per schedule name.

A definition may carry a timing and a call (a schedule made at runtime), or only a state (paused, runs asked
for) for a schedule declared in code, or a timing that overrides the code's. The core never interprets the
call: an adapter turns it into a framework message (a Dramatiq actor's or a Celery task's). Definitions are
JSON, read back with ``json.loads`` and checked field by field; nothing stored is ever evaluated.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, DelayBrokerError
from .timing import Timing

FORMAT = 1
RUN_NOW = "\x1frun-now"
"""Suffix of the record of a schedule's run-now occurrences (a control character: no schedule name has one)."""
MAX_RUNS = 20
"""Run-now requests kept per schedule; older ones that were never served are dropped."""
MAX_NESTING = 100
"""Deepest nesting of lists and objects in a call's arguments and options. ``json.loads`` recurses, and how deep
it can go depends on the stack of the thread reading (a promoter's is deeper): a limit well below Python's keeps
every stored call readable everywhere."""
READABLE_NESTING = 1000
"""Deepest nesting of a stored definition any reader takes (an earlier release stored calls deeper than
:data:`MAX_NESTING`). Python 3.10 and 3.11's ``json.loads`` stop near their recursion limit of 1000, 3.12's
goes much deeper: without this, promoters on different Pythons would disagree on what a schedule is."""


class CorruptSchedule(DelayBrokerError, ValueError):
    """A stored schedule definition this version cannot read (it is skipped and reported, never run)."""


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"a schedule needs a non-empty name, got {name!r}")
    if any(ord(character) < 32 or ord(character) == 127 for character in name):
        raise ConfigurationError(f"a schedule name must not contain control characters, got {name!r}")
    return name


def occurrence_id(namespace: str, schedule: str, due_ms: int) -> str:
    """The message id of one occurrence: the same in every process, a UUID as Dramatiq and Celery use."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"delay-broker:{namespace}:{schedule}:{due_ms}"))


def run_now_record(name: str) -> str:
    """The record under which the run-now occurrences of schedule ``name`` are parked, once each."""
    return name + RUN_NOW


def is_run_now_record(record: str) -> bool:
    return record.endswith(RUN_NOW)


REWOUND = "\x1frewound"
"""Suffix of the record that says when a schedule's record was last rewound to "now" by a change: while the two
are equal, no occurrence was parked since, and the record names none."""


def rewound_record(name: str) -> str:
    return name + REWOUND


def is_marker_record(record: str) -> bool:
    """Whether a record of the schedules' hash is one of the markers beside a schedule's own."""
    return record.endswith((RUN_NOW, REWOUND))


@dataclass(frozen=True)
class ScheduledCall:
    """The message a runtime schedule sends: a task (Celery) or actor (Dramatiq) name with its arguments and
    message options (Celery ``apply_async`` options, Dramatiq ``send_with_options`` options)."""

    task: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        task: str,
        args: Any = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        *,
        stored: bool = False,
    ) -> ScheduledCall:
        """A call to store, checked; ``stored``: read back from Redis, where the nesting limit of new calls does
        not apply (an earlier release stored deeper ones, which still run)."""
        if not isinstance(task, str) or not task:
            raise ConfigurationError(f"task must be a task or actor name, got {task!r}")
        if isinstance(args, str | bytes) or not isinstance(args, list | tuple):
            raise ConfigurationError(f"args must be a list or tuple, got {type(args).__name__}")
        for label, value in (("kwargs", kwargs), ("options", options)):
            if value is not None and not (isinstance(value, Mapping) and all(isinstance(k, str) for k in value)):
                raise ConfigurationError(f"{label} must be a mapping with string keys, got {value!r}")
        for reserved in ("eta", "countdown", "task_id", "delay", "message_id"):
            if reserved in (options or {}):
                raise ConfigurationError(f"{reserved!r} is set by the schedule for each occurrence")
        if not stored:
            for label, given in (("args", args), ("kwargs", kwargs), ("options", options)):
                _check_nesting(label, given)
        call = cls(task, tuple(args), dict(kwargs or {}), dict(options or {}))
        try:
            json.dumps(call.as_json())
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"the arguments of a stored schedule must be JSON: {error}") from None
        return call

    def as_json(self) -> dict[str, Any]:
        return {"task": self.task, "args": list(self.args), "kwargs": dict(self.kwargs), "options": dict(self.options)}


@dataclass(frozen=True)
class ScheduleDefinition:
    """One stored schedule. ``timing``/``call`` None: the code's declaration of the same name supplies them."""

    name: str
    timing: Timing | None = None
    call: ScheduledCall | None = None
    paused: bool = False
    runs: tuple[int, ...] = ()
    """Redis times (ms) of run-now requests; each is parked once, under :func:`run_now_record`."""
    updated_ms: int = 0

    def encode(self) -> bytes:
        timing = self.timing
        document: dict[str, Any] = {
            "format": FORMAT,
            "timing": None
            if timing is None
            else {
                "cron": timing.cron,
                "every_ms": timing.every_ms,
                "timezone": timing.zone_name,
                "start_ms": timing.start_ms,
                "end_ms": timing.end_ms,
            },
            "call": None if self.call is None else self.call.as_json(),
            "paused": self.paused,
            "runs": list(self.runs[-MAX_RUNS:]),
            "updated_ms": self.updated_ms,
        }
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, name: str, raw: bytes) -> ScheduleDefinition:
        """Read a stored definition; raises :class:`CorruptSchedule` naming what is wrong."""
        try:
            document = json.loads(raw)
            _check_nesting("its values", document, READABLE_NESTING)
            if not isinstance(document, dict) or document.get("format") != FORMAT:
                raise ValueError(f"not a format {FORMAT} schedule definition")
            timing = document.get("timing")
            call = document.get("call")
            runs = document.get("runs", [])
            paused = document.get("paused", False)
            if not isinstance(runs, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in runs):
                raise ValueError("runs must be a list of integers")
            if not isinstance(paused, bool):
                raise ValueError("paused must be true or false")
            if timing is not None and not isinstance(timing, dict):
                raise ValueError("timing must be an object")
            if call is not None and not isinstance(call, dict):
                raise ValueError("call must be an object")
            updated_ms = document.get("updated_ms", 0)
            if isinstance(updated_ms, bool) or not isinstance(updated_ms, int):
                raise ValueError(f"updated_ms must be an integer, got {str(updated_ms)[:40]}")
            return cls(
                name=name,
                timing=None if timing is None else Timing.from_fields(**_fields(timing, Timing.FIELDS)),
                call=None
                if call is None
                else ScheduledCall.create(**_fields(call, ("task", "args", "kwargs", "options")), stored=True),
                paused=paused,
                runs=tuple(runs),
                updated_ms=updated_ms,
            )
        except Exception as error:
            # Whatever the stored text makes fail (a number too large, nesting too deep for json, a time zone
            # the file system refuses ...), the definition is unreadable: skipped and reported, never fatal to
            # the readers (every promoter of the namespace reads every definition).
            problem = str(error) or type(error).__name__
            hint = f"'delay-broker cron remove {name}' deletes it"
            raise CorruptSchedule(f"stored schedule {name!r} cannot be read: {problem[:200]} ({hint})") from None


def _check_nesting(label: str, value: object, limit: int = MAX_NESTING) -> None:
    """Refuse ``value`` nested deeper than ``limit`` (walked without recursion, so that a value too deep for
    Python is refused too rather than failing here)."""
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth >= limit:
            raise ConfigurationError(f"{label} are nested more than {limit} levels deep")
        pending.extend((child, depth + 1) for child in children)


def _fields(document: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    unknown = set(document) - set(names)
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}")
    return {name: document.get(name) for name in names if name in document}
