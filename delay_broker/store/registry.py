"""What the store records beside its messages: the routes producers parked for, and the recurring schedules'
records and runtime definitions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from ..records import ScheduleUpdate, StoredSchedules
from ..schedule_defs import is_marker_record
from .replication import Replication
from .replies import int_or_none, text
from .runner import Runner
from .shards import Shards, push_wake


class Registry:
    """Routes and schedules, kept in shard 0."""

    def __init__(self, shards: Shards, runner: Runner, replication: Replication) -> None:
        self.shards = shards
        self.runner = runner
        self.replication = replication

    def record_routes(self, routes: Iterable[str]) -> None:
        names = [route for route in routes if isinstance(route, str) and route]
        if not names:
            return
        keys, client = self.shards.keys, self.shards.client
        with self.shards.calling("recording routes"):
            if self.replication.replicas:
                self.replication.write("recording routes", keys, lambda pipe: pipe.sadd(keys.routes, *names))
            else:
                client.sadd(keys.routes, *names)

    def recorded_routes(self) -> set[str]:
        with self.shards.calling("reading routes"):
            members = self.shards.client.smembers(self.shards.keys.routes)
        return {text(member) for member in members}

    def schedules(self) -> dict[str, int | None]:
        with self.shards.calling("reading schedules"):
            records = self.shards.client.hgetall(self.shards.keys.cron)
        return {text(name): int_or_none(value) for name, value in records.items() if not is_marker_record(text(name))}

    def forget_schedule(self, name: str) -> bool:
        keys = self.shards.keys
        with self.shards.calling("forgetting a schedule"):
            pipe = self.shards.client.pipeline(transaction=True)
            pipe.hdel(keys.cron, name)
            pipe.incr(keys.schedules_rev)
            push_wake(pipe, keys.wake, keys.wake)  # the token the scripts' wake_one pushes
            return bool(pipe.execute()[0])

    def stored_schedules(self) -> StoredSchedules:
        keys = self.shards.keys
        with self.shards.calling("reading schedules"):
            pipe = self.shards.client.pipeline(transaction=False)
            pipe.get(keys.schedules_rev)
            pipe.hgetall(keys.schedules)
            pipe.hgetall(keys.cron)
            revision, definitions, records = pipe.execute()
        return StoredSchedules(
            int(revision or 0),
            {text(name): bytes(value) for name, value in definitions.items()},
            {text(name): int_or_none(value) for name, value in records.items()},
        )

    def schedules_revision(self) -> int:
        with self.shards.calling("reading schedules"):
            return int(self.shards.client.get(self.shards.keys.schedules_rev) or 0)

    def update_schedule(
        self,
        name: str,
        definition: bytes | None,
        revision: int | None,
        record: int | None,
        record_action: Literal["keep", "rewind", "drop"],
        cancel: str | None,
        drop_also: str | None,
        marker: str | None,
    ) -> ScheduleUpdate:
        if not isinstance(name, str) or not name:
            raise ValueError(f"schedule must be a non-empty string, got {name!r}")
        args = [
            name,
            b"" if definition is None else definition,
            "" if revision is None else revision,
            "" if record is None else record,
            record_action,
            cancel or "",
            drop_also or "",
            marker or "",
        ]
        done, current, now_ms, cancelled = self.runner.by_id("schedule_update", 0, [cancel] if cancel else [], args)
        return ScheduleUpdate(bool(int(done)), int(current), int(now_ms), bool(int(cancelled)))
