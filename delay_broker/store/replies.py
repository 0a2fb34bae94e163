"""Small pieces every part of the store shares: id checks, batching, and decoding what scripts return."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, TypeVar

from ..clock import due_of_score
from ..errors import InvalidMessage
from ..records import MessageInfo

MAX_BATCH = 1000
MAX_ID_LENGTH = 512

ListState = Literal["due", "inflight", "dead"]

T = TypeVar("T")


def check_id(id: object) -> str:
    if not isinstance(id, str):
        raise InvalidMessage(f"message id must be a string, got {type(id).__name__}")
    if not id or len(id) > MAX_ID_LENGTH:
        raise InvalidMessage(f"message id must be 1 to {MAX_ID_LENGTH} characters, got {len(id)}")
    if not id.isascii():
        try:
            id.encode()
        except UnicodeEncodeError:  # a lone surrogate: Redis keeps bytes, and these have no UTF-8 form
            raise InvalidMessage(f"message id must be text UTF-8 can encode, got {id!r}") from None
    return id


def check_batch(batch: int) -> int:
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be 1..{MAX_BATCH}, got {batch}")
    return batch


def check_state(state: str) -> None:
    if state not in ("due", "inflight", "dead"):
        raise ValueError(f"state must be 'due', 'inflight' or 'dead', got {state!r}")


def chunks(items: list[T]) -> Iterator[list[T]]:
    for start in range(0, len(items), MAX_BATCH):
        yield items[start : start + MAX_BATCH]


def text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def stored_id(raw: bytes) -> str:
    """An id read back from Redis. One that is not UTF-8 was not parked by delay_broker (its ids are text), and is
    shown with its odd bytes escaped rather than failing the whole listing."""
    return raw.decode(errors="backslashreplace")


def int_or_none(value: bytes | str) -> int | None:
    # Digits only, as park.lua reads a schedule's record: int() would also take ' 12 ', '+12', '-5' or '1_000',
    # which the script refuses, and the two would disagree on the latest occurrence.
    raw = value.encode() if isinstance(value, str) else value
    return int(raw) if raw.isdigit() and raw.isascii() else None


def seconds_text(ms: int) -> str:
    """Milliseconds as the scripts' refusals write them (``seconds_text`` in the Lua helpers)."""
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms / 1000:.3f} s"


def listed(
    state: ListState, id: bytes, score: Any, raw: Any, attempts: Any, error: Any, *, omitted: bool = False
) -> tuple[float, MessageInfo]:
    """A message as list.lua and find.lua return it, with its score (``omitted``: asked without payloads)."""
    value = float(score)
    info = MessageInfo(
        id=stored_id(id),
        state=state,
        due_ms=due_of_score(value) if state == "due" else None,
        at_ms=None if state == "due" else int(value),
        raw=raw or None,
        attempts=int(attempts),
        error=text(error) if error else None,
        payload_omitted=omitted,
    )
    return value, info


def listed_page(state: ListState, reply: list[Any], *, omitted: bool = False) -> list[tuple[float, MessageInfo]]:
    """Every message of a list.lua reply (five entries each)."""
    return [listed(state, *reply[n : n + 5], omitted=omitted) for n in range(0, len(reply), 5)]
