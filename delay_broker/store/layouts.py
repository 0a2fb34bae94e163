"""A namespace's shard layout as its layout key records it, with the generation a reshard moves on, and the view
of it one process parks and reads by (see docs/scaling.md, "Changing the shard count online").

The key holds a plain count (generation 0, as every release before resharding wrote it) or a JSON object:
``generation``, ``shards`` (the layout parks go to), and during a reshard ``state`` (``announced`` then
``moving``), ``to`` or ``from`` (the other count) and ``since`` (Redis clock, ms); once one is finished,
``previous`` (the count it came from).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..errors import ConfigurationError
from ..keys import MAX_SHARDS

State = Literal["stable", "announced", "moving"]

LAYOUT_TTL = 1.0
"""Seconds a process parks and reads by the layout it read last, before it reads the key again (as it is used)."""

_FIELDS = {"generation", "shards", "state", "to", "from", "since", "previous"}


@dataclass(frozen=True)
class Layout:
    """One value of the layout key.

    Parameters:
      generation: the number every shard's marker is compared with (a park by an older one is refused).
      shards: the count parks go to.
      state: ``stable``, or during a reshard ``announced`` (parks still by ``shards``, moving ``to`` later) or
        ``moving`` (parks by ``shards``, messages of the ``source`` count re-homed).
      other: ``to`` when announced, ``from`` when moving, ``previous`` when stable after a reshard.
      since_ms: when the state began (Redis clock).
      recorded: whether the key held it (absent: one shard, not recorded yet).
    """

    generation: int = 0
    shards: int = 1
    state: State = "stable"
    other: int | None = None
    since_ms: int | None = None
    recorded: bool = True

    @classmethod
    def parse(cls, raw: bytes | str | None, key: str) -> Layout:
        """The layout ``key`` holds (``raw``; None: absent). Anything else than this module writes is refused."""
        if raw is None:
            return cls(recorded=False)
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        if text.isdigit() and text.isascii():
            return cls(shards=_count(int(text), text, key))
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not set(data) <= _FIELDS:
            raise _malformed(text, key)
        return cls._of(data, text, key)

    @classmethod
    def _of(cls, data: dict[str, Any], text: str, key: str) -> Layout:
        state = data.get("state", "stable")
        other_field = {"stable": "previous", "announced": "to", "moving": "from"}.get(state)
        numbers = [data.get(name) for name in ("generation", "shards", other_field or "", "since")]
        if other_field is None or any(n is not None and (type(n) is not int or n < 0) for n in numbers):
            raise _malformed(text, key)
        generation, shards, other, since = numbers
        if generation is None or shards is None or (state != "stable" and (other is None or since is None)):
            raise _malformed(text, key)
        layout = cls(generation, _count(shards, text, key), state, other, since)
        if other is not None:
            _count(other, text, key)
        return layout

    def encode(self) -> str:
        """The key's value: the plain count for generation 0 with nothing else to say (as earlier releases read)."""
        if self.generation == 0 and self.state == "stable" and self.other is None:
            return str(self.shards)
        data: dict[str, Any] = {"generation": self.generation, "shards": self.shards}
        if self.state != "stable":
            data["state"] = self.state
        if self.other is not None:
            data[{"stable": "previous", "announced": "to", "moving": "from"}[self.state]] = self.other
        if self.since_ms is not None and self.state != "stable":
            data["since"] = self.since_ms
        return json.dumps(data, separators=(",", ":"))

    # -- a reshard's steps -----------------------------------------------------------------------------

    def announced(self, to: int, now_ms: int) -> Layout:
        return Layout(self.generation, self.shards, "announced", to, now_ms)

    def moving(self, now_ms: int) -> Layout:
        assert self.state == "announced" and self.other is not None
        return Layout(self.generation + 1, self.other, "moving", self.shards, now_ms)

    def finished(self) -> Layout:
        assert self.state == "moving"
        return Layout(self.generation, self.shards, "stable", self.other)

    def unrecorded(self) -> Layout:
        return replace(self, recorded=False)

    @property
    def source(self) -> int:
        """The count messages are (or will be) moved from: the old layout of a reshard, else ``shards``."""
        if self.state == "moving":
            assert self.other is not None
            return self.other
        return self.shards

    @property
    def target(self) -> int:
        """The count messages are (or will be) moved to: the new layout of a reshard, else ``shards``."""
        if self.state == "announced":
            assert self.other is not None
            return self.other
        return self.shards

    def describe(self) -> str:
        if self.state == "announced":
            return f"{self.shards} shard(s), generation {self.generation}, a reshard to {self.other} announced"
        if self.state == "moving":
            return f"{self.shards} shard(s), generation {self.generation}, moving from {self.other}"
        return f"{self.shards} shard(s), generation {self.generation}"


def _count(value: int, text: str, key: str) -> int:
    if not 1 <= value <= MAX_SHARDS:
        raise _malformed(text, key)
    return value


def _malformed(text: str, key: str) -> ConfigurationError:
    return ConfigurationError(
        f"malformed shard layout {text[:200]!r} in {key}: set it to the number of shards (a reshard writes a JSON "
        "object there, which this release reads; an older release cannot)"
    )


@dataclass(frozen=True)
class View:
    """The layout as one process uses it: its shards numbered as the process knows them (see
    :class:`~delay_broker.store.shards.Shards`).

    Parameters:
      layout: the layout key's value.
      homes: per shard of the layout parks go to, its number.
      old: during a reshard, per shard of the source layout, its number (the first place a message is looked for).
      new: during a reshard, per shard of the target layout, its number.
      serving: the numbers of every shard of the layouts in use (both during a reshard), in order.
    """

    layout: Layout
    homes: tuple[int, ...]
    old: tuple[int, ...] | None = None
    new: tuple[int, ...] | None = None
    serving: tuple[int, ...] = ()

    @property
    def generation(self) -> int:
        return self.layout.generation

    @property
    def resharding(self) -> bool:
        return self.layout.state != "stable"

    @property
    def moving(self) -> bool:
        """Whether parks go to the new layout while messages are re-homed (parks of an id whose home changes
        look at its old home too)."""
        return self.layout.state == "moving"

    def home(self, id: str) -> int:
        """Where a park of ``id`` goes."""
        homes = self.homes
        return homes[0] if len(homes) == 1 else homes[zlib.crc32(id.encode()) % len(homes)]

    def old_home(self, id: str) -> int:
        """Where ``id`` lives in the source layout (its home when no reshard is under way)."""
        return self.home(id) if self.old is None else _pick(self.old, id)

    def new_home(self, id: str) -> int:
        """Where ``id`` lives in the target layout (its home when no reshard is under way)."""
        return self.home(id) if self.new is None else _pick(self.new, id)

    def crossing(self, id: str) -> bool:
        """Whether a park of ``id`` must look at another shard than its home: it moves, and parks go to the new
        layout already."""
        return self.moving and self.old_home(id) != self.home(id)

    def to_search(self, id: str) -> list[int]:
        """The shards that may hold ``id``, in the order to look: its old home, its new one (messages move only
        that way), and shard 0, where a schedule's occurrences live."""
        order = [self.old_home(id), self.new_home(id), 0]
        return list(dict.fromkeys(order))

    def in_transit_after(self, shard: int) -> bool:
        """Whether a look at ``shard`` must be followed by one at its batches in transit (before the next shard)."""
        return self.old is not None and shard in self.old


def _pick(homes: tuple[int, ...], id: str) -> int:
    return homes[0] if len(homes) == 1 else homes[zlib.crc32(id.encode()) % len(homes)]
