"""What a promoter reports of its work: the totals it keeps, and the listener it tells as it goes (for metrics)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class PromoterCounters:
    """Totals of one promoter since it started (the store's counters are the cluster-wide view)."""

    cycles: int = 0
    promoted: int = 0
    dead_lettered: int = 0
    retried: int = 0
    errors: int = 0
    missed: int = 0
    """Occurrences of recurring schedules skipped (no promoter ran them in time), as found by this promoter."""
    lateness_ms: list[int] = field(default_factory=list)
    keep_lateness: bool = False

    def record(self, count: int, lateness: Sequence[int]) -> None:
        """``count`` messages promoted, with how late each was when it is known (``lateness``)."""
        self.promoted += count
        if self.keep_lateness:
            self.lateness_ms.extend(lateness)


class PromoterListener:
    """Told what a promoter does, for metrics: subclass it and override what you need (here every method does
    nothing). Called from the promoter's thread; must not block.

    A listener written before this class, with ``promoted``, ``dead_lettered`` and ``failed`` only, is still
    taken (see :func:`as_listener`).
    """

    def promoted(self, lateness_ms: Sequence[int]) -> None:
        """Messages handed to their queue, with how late each was (ms past its due time)."""

    def dead_lettered(self, count: int) -> None:
        """Messages dead-lettered (refused by their queue, unreadable, or out of attempts)."""

    def failed(self, stage: str) -> None:
        """A failure, by stage: ``redis``, ``target``, ``configuration`` or ``internal``."""

    def promoted_by_task(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Messages promoted in one batch, per (queue, task or actor name)."""

    def missed(self, schedule: str, count: int) -> None:
        """Occurrences of a recurring schedule skipped (no promoter ran them in time)."""


class BasicListener(Protocol):
    """The least a listener has (all a listener written before :class:`PromoterListener` had)."""

    def promoted(self, lateness_ms: Sequence[int]) -> None: ...

    def dead_lettered(self, count: int) -> None: ...

    def failed(self, stage: str) -> None: ...


def as_listener(listener: BasicListener | None) -> PromoterListener:
    """``listener`` as a :class:`PromoterListener`: itself if it is one, a no-op one for None, else wrapped once
    (its methods looked up now, not at every call; those it lacks do nothing). A listener that lacks one of
    the three basic methods is refused here rather than failing in the promoter's loop."""
    if isinstance(listener, PromoterListener):
        return listener
    if listener is None:
        return PromoterListener()
    return _Wrapped(listener)


_BASIC = ("promoted", "dead_lettered", "failed")


class _Wrapped(PromoterListener):
    """A listener that is no :class:`PromoterListener`: its own methods, and no-ops for those it lacks."""

    def __init__(self, listener: BasicListener) -> None:
        missing = [name for name in _BASIC if not callable(getattr(listener, name, None))]
        if missing:
            raise TypeError(f"a promoter listener needs {', '.join(missing)}(): {listener!r} has no such method")
        self.wrapped = listener
        self._promoted = listener.promoted
        self._dead_lettered = listener.dead_lettered
        self._failed = listener.failed
        self._promoted_by_task: Callable[[Mapping[tuple[str, str], int]], None] = _method_or(
            listener, "promoted_by_task", super().promoted_by_task
        )
        self._missed: Callable[[str, int], None] = _method_or(listener, "missed", super().missed)

    def promoted(self, lateness_ms: Sequence[int]) -> None:
        self._promoted(lateness_ms)

    def dead_lettered(self, count: int) -> None:
        self._dead_lettered(count)

    def failed(self, stage: str) -> None:
        self._failed(stage)

    def promoted_by_task(self, counts: Mapping[tuple[str, str], int]) -> None:
        self._promoted_by_task(counts)

    def missed(self, schedule: str, count: int) -> None:
        self._missed(schedule, count)

    def __repr__(self) -> str:
        return f"<listener {self.wrapped!r}>"


def _method_or(listener: object, name: str, default: Callable[..., None]) -> Callable[..., None]:
    method = getattr(listener, name, None)
    return method if callable(method) else default
