"""Recurring schedules managed at runtime: add, change, pause, resume, run now and remove, without a deploy.

Definitions live in the store (shard 0, beside the schedules' records), so every promoter of the namespace
runs them; each change wakes a promoter and moves a revision the others read within a second or at their
next cycle. Changes are compare-and-set on that revision and on the schedule's record, so two operators
changing schedules at once never lose each other's change, and a promoter never parks an occurrence built
from a definition that changed meanwhile. Each occurrence still runs once, with any number of promoters.

Schedules declared in code (``DelayMiddleware.schedule``, ``delay_broker.celery.schedule``) can be paused,
resumed, run now and re-timed here too: the stored definition then carries only what it overrides.

    from delay_broker import DelayStore, RuntimeSchedules

    schedules = RuntimeSchedules(DelayStore.from_url("redis://localhost:6379/0"))
    schedules.add("nightly-report", "send_report", cron="0 3 * * *", args=[42], timezone="Europe/Paris")
    schedules.pause("nightly-report")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .clock import iso_time
from .errors import ConfigurationError, DelayBrokerError
from .schedule_defs import (
    MAX_RUNS,
    CorruptSchedule,
    ScheduledCall,
    ScheduleDefinition,
    check_name,
    is_marker_record,
    occurrence_id,
    rewound_record,
    run_now_record,
)
from .store import DelayStore
from .timing import Timing, instant_ms

__all__ = ["RuntimeSchedules", "ScheduleDefinition", "ScheduleNotFound", "ScheduledCall"]

ATTEMPTS = 20
"""Compare-and-set rounds before a change gives up (only under a storm of concurrent changes)."""

_UNCHANGED: Any = object()


class ScheduleNotFound(DelayBrokerError, KeyError):
    """No schedule of that name: neither stored nor declared in code (with a record in the store)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such schedule"


class RuntimeSchedules:
    """The runtime schedules of one store's namespace.

    ``check`` (given by the adapters' helpers) validates a call before it is stored, e.g. that the actor
    exists; the core cannot, as it knows no framework. ``declared`` gives the names of the schedules this
    process's code declares, which can be paused, resumed, re-timed and run before any promoter parked them.
    """

    def __init__(
        self,
        store: DelayStore,
        check: Callable[[ScheduledCall], None] | None = None,
        declared: Callable[[], Collection[str]] | None = None,
    ) -> None:
        self.store = store
        self.check = check
        self.declared = declared

    # -- reading -------------------------------------------------------------------------------------------------

    def all(self) -> dict[str, ScheduleDefinition]:
        """Every stored definition, by name (unreadable ones are left out; :meth:`get` names the problem)."""
        stored = self.store.stored_schedules()
        found = {}
        for name, raw in stored.definitions.items():
            try:
                found[name] = ScheduleDefinition.decode(name, raw)
            except CorruptSchedule:
                continue
        return found

    def get(self, name: str) -> ScheduleDefinition | None:
        """The stored definition of ``name``, or None. Raises :class:`CorruptSchedule` for an unreadable one."""
        raw = self.store.stored_schedules().definitions.get(name)
        return None if raw is None else ScheduleDefinition.decode(name, raw)

    def records(self) -> dict[str, int | None]:
        """Every schedule that parked an occurrence (stored or declared): name -> due ms of the latest."""
        return {name: due for name, due in self.store.stored_schedules().records.items() if not is_marker_record(name)}

    # -- changes -------------------------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        task: str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        start: datetime | None = None,
        end: datetime | None = None,
        paused: bool = False,
    ) -> ScheduleDefinition:
        """Store a new schedule sending ``task`` (a Celery task or Dramatiq actor name) with ``args`` and
        ``kwargs`` (JSON values) and message ``options``, at every occurrence of ``cron`` (in ``timezone``) or
        ``every`` seconds (counted from ``start``, else from the epoch), between ``start`` and ``end``.

        Raises :class:`ConfigurationError` if a schedule of that name is already stored (use :meth:`change`).
        """
        check_name(name)
        timing = Timing.create(cron=cron, every=every, timezone=timezone, start=start, end=end)
        call = self._checked(ScheduledCall.create(task, args, kwargs, options))

        def make(current: ScheduleDefinition | None, now_ms: int) -> ScheduleDefinition:
            if current is not None and (current.call is not None or current.timing is not None):
                raise ConfigurationError(f"a schedule named {name!r} is already stored: change or remove it")
            runs = current.runs if current else ()
            return ScheduleDefinition(name, timing, call, paused, runs, now_ms)

        return _written(self._update(name, make, record_action="rewind", cancel_parked=True))

    def change(
        self,
        name: str,
        *,
        task: str = _UNCHANGED,
        cron: str | None = _UNCHANGED,
        every: float | timedelta | None = _UNCHANGED,
        args: Sequence[Any] = _UNCHANGED,
        kwargs: Mapping[str, Any] | None = _UNCHANGED,
        options: Mapping[str, Any] | None = _UNCHANGED,
        timezone: str = _UNCHANGED,
        start: datetime | None = _UNCHANGED,
        end: datetime | None = _UNCHANGED,
    ) -> ScheduleDefinition:
        """Change what is given and keep the rest (``start=None``/``end=None`` remove a date). The next
        occurrence parked under the old definition is cancelled and the first one after now under the new one
        is parked instead. For a schedule declared in code, a timing given here overrides the code's (until
        :meth:`remove`); its message is the code's.
        """
        check_name(name)

        def make(current: ScheduleDefinition | None, now_ms: int) -> ScheduleDefinition:
            base = current or ScheduleDefinition(name)
            timing = _changed_timing(base.timing, cron, every, timezone, start, end)
            call = base.call
            if any(value is not _UNCHANGED for value in (task, args, kwargs, options)):
                if call is None and task is _UNCHANGED:
                    raise ConfigurationError(
                        f"schedule {name!r} sends what its code declares: give task= to store a message of its own"
                    )
                old = call or ScheduledCall("")
                call = self._checked(
                    ScheduledCall.create(
                        old.task if task is _UNCHANGED else task,
                        old.args if args is _UNCHANGED else args,
                        old.kwargs if kwargs is _UNCHANGED else kwargs,
                        old.options if options is _UNCHANGED else options,
                    )
                )
            return dataclasses.replace(base, timing=timing, call=call, updated_ms=now_ms)

        return _written(self._update(name, make, record_action="rewind", cancel_parked=True, must_exist=True))

    def pause(self, name: str) -> ScheduleDefinition:
        """Stop parking occurrences; the one already parked (not yet due) is cancelled. Run-now still works."""
        return self._set_paused(name, True)

    def resume(self, name: str) -> ScheduleDefinition:
        """Park occurrences again, from the first one after now (those that fell in the pause are not run)."""
        return self._set_paused(name, False)

    def _set_paused(self, name: str, paused: bool) -> ScheduleDefinition:
        def make(current: ScheduleDefinition | None, now_ms: int) -> ScheduleDefinition:
            base = current or ScheduleDefinition(name)
            if base.paused == paused:
                # Already so: nothing is written. A resume of a running schedule must not rewind its record
                # below the occurrence parked (it would be parked again once it ran).
                raise _Unchanged(base)
            return dataclasses.replace(base, paused=paused, updated_ms=now_ms)

        # Resuming rewinds the record to now: the next occurrence parked is the first after now. A paused
        # schedule has none parked; should one be there after all, it is cancelled, never left below the record.
        action = "keep" if paused else "rewind"
        return _written(self._update(name, make, record_action=action, cancel_parked=True, must_exist=True))

    def run_now(self, name: str) -> str:
        """Send the schedule's message once now, besides its occurrences (paused or not). Returns the id the
        message will have: a promoter that runs the schedule parks it, once, within a second or so."""
        requested: list[int] = []

        def make(current: ScheduleDefinition | None, now_ms: int) -> ScheduleDefinition:
            base = current or ScheduleDefinition(name)
            requested[:] = [now_ms]
            return dataclasses.replace(base, runs=(*base.runs, now_ms)[-MAX_RUNS:], updated_ms=now_ms)

        self._update(name, make, record_action="keep", cancel_parked=False, must_exist=True, served=True)
        return occurrence_id(self.store.keys.namespace, run_now_record(name), requested[0])

    def remove(self, name: str) -> bool:
        """Delete the stored definition and the schedule's record, and cancel its parked occurrence. A schedule
        declared in code goes back to its code's timing (from its next occurrence). False if nothing was stored."""
        removed: list[bool] = []

        def make(current: ScheduleDefinition | None, now_ms: int) -> None:
            removed[:] = [current is not None]
            return None

        # An unreadable definition can still be removed: that is how an operator gets rid of it.
        self._update(name, make, record_action="drop", cancel_parked=True, unreadable_ok=True)
        return removed[0]

    # -- plumbing ------------------------------------------------------------------------------------------------

    def _declared(self) -> Collection[str]:
        return () if self.declared is None else self.declared()

    def _checked(self, call: ScheduledCall) -> ScheduledCall:
        if self.check is not None:
            self.check(call)
        return call

    def _update(
        self,
        name: str,
        make: Callable[[ScheduleDefinition | None, int], ScheduleDefinition | None],
        *,
        record_action: str,
        cancel_parked: bool,
        must_exist: bool = False,
        served: bool = False,
        unreadable_ok: bool = False,
    ) -> ScheduleDefinition | None:
        """Read, ``make`` the new definition, and write it if nothing moved in between; else read again.
        ``make`` raising :class:`_Unchanged` writes nothing. With ``unreadable_ok``, an unreadable definition
        is given to ``make`` as a bare one of its name (for ``remove``, which reads nothing in it)."""
        for _ in range(ATTEMPTS):
            stored = self.store.stored_schedules()
            raw = stored.definitions.get(name)
            try:
                current = None if raw is None else ScheduleDefinition.decode(name, raw)
            except CorruptSchedule:
                if not unreadable_ok:
                    raise
                current = ScheduleDefinition(name)
            if name in stored.records and stored.records[name] is None:
                raise CorruptSchedule(
                    f"the record of schedule {name!r} is malformed: 'delay-broker cron forget {name}' clears it"
                )
            record = stored.records.get(name)
            if must_exist and current is None and record is None and name not in self._declared():
                raise ScheduleNotFound(
                    f"no schedule {name!r} in namespace {self.store.keys.namespace!r}: none is stored, none is "
                    "declared in this process's code, and none declared elsewhere has parked an occurrence yet"
                )
            if served and current is not None:
                # Run-now requests already parked need not be kept.
                done = stored.records.get(run_now_record(name)) or -1
                current = dataclasses.replace(current, runs=tuple(r for r in current.runs if r > done))
            try:
                definition = make(current, self.store.now_ms())
            except _Unchanged as unchanged:
                return unchanged.definition
            cancel = None
            if cancel_parked and record is not None:
                cancel = occurrence_id(self.store.keys.namespace, name, record)
            update = self.store.update_schedule(
                name,
                None if definition is None else definition.encode(),
                revision=stored.revision,
                record=record,
                record_action=record_action,  # type: ignore[arg-type]
                cancel=cancel,
                drop_also=run_now_record(name),
                marker=rewound_record(name),
            )
            if update.done:
                return definition
        raise DelayBrokerError(f"schedule {name!r} kept changing under this change: try again")


class _Unchanged(Exception):
    """Raised by a ``make`` of :meth:`RuntimeSchedules._update` when the change is already made."""

    def __init__(self, definition: ScheduleDefinition) -> None:
        super().__init__(definition.name)
        self.definition = definition


def _written(definition: ScheduleDefinition | None) -> ScheduleDefinition:
    assert definition is not None, "only remove() stores nothing"
    return definition


def _changed_timing(
    timing: Timing | None,
    cron: Any,
    every: Any,
    timezone: Any,
    start: Any,
    end: Any,
) -> Timing | None:
    """``timing`` with what was given changed (cron and every replace each other)."""
    if all(value is _UNCHANGED for value in (cron, every, timezone, start, end)):
        return timing
    if timing is None and cron is _UNCHANGED and every is _UNCHANGED:
        raise ConfigurationError("this schedule's timing is its code's: give cron= or every= to override it")
    old = timing or Timing()
    if cron is not _UNCHANGED and cron is not None:
        new_cron, every_ms = cron, None
    elif every is not _UNCHANGED and every is not None:
        new_cron, every_ms = None, Timing.create(every=every).every_ms
    else:
        new_cron, every_ms = old.cron, old.every_ms

    def instant(value: Any, kept: int | None) -> int | None:
        if value is _UNCHANGED:
            return kept
        return instant_ms("start or end", value)

    return Timing.from_fields(
        cron=new_cron,
        every_ms=every_ms,
        timezone=old.zone_name if timezone is _UNCHANGED else timezone,
        start_ms=instant(start, old.start_ms),
        end_ms=instant(end, old.end_ms),
    )


# -- overview (the CLI's cron ls and the dashboard's schedules page) --------------------------------------------

STATE_WORDS = {"due": "parked", "inflight": "in flight", "dead": "dead-lettered", "gone": "gone"}


def schedule_rows(store: DelayStore) -> list[dict[str, Any]]:
    stored = store.stored_schedules()
    rows = []
    for name in sorted({*stored.definitions, *(r for r in stored.records if not is_marker_record(r))}):
        due_ms = stored.records.get(name)
        malformed = name in stored.records and due_ms is None
        if due_ms is not None and stored.records.get(rewound_record(name)) == due_ms:
            due_ms = None  # rewound by a change, and nothing parked since: the record is no occurrence
        id = None if due_ms is None else occurrence_id(store.keys.namespace, name, due_ms)
        info = None if id is None else store.get(id)
        state = "malformed record" if malformed else "none parked" if id is None else None
        state = state or (STATE_WORDS[info.state] if info else "gone (ran or cancelled)")
        row: dict[str, Any] = {"name": name, "due_ms": due_ms, "due": iso_time(due_ms), "id": id, "state": state}
        row.update(definition_fields(name, stored.definitions.get(name)))
        rows.append(row)
    return rows


def definition_fields(name: str, raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {"source": "code", "timing": None, "task": None, "paused": False}
    try:
        definition = ScheduleDefinition.decode(name, raw)
    except CorruptSchedule as error:
        return {"source": "stored", "timing": None, "task": None, "paused": False, "problem": str(error)}
    return {
        "source": "stored" if definition.call is not None else "code, overridden",
        "timing": None if definition.timing is None else definition.timing.describe(),
        "task": None if definition.call is None else definition.call.task,
        "args": None if definition.call is None else list(definition.call.args),
        "kwargs": None if definition.call is None else dict(definition.call.kwargs),
        "paused": definition.paused,
    }
