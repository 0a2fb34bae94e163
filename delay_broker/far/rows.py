"""A far message as the table holds it, and what PostgreSQL can hold."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidMessage


def check_storable(id: str, route: str, name: str) -> None:
    """Refuse a far message PostgreSQL cannot hold: its text columns take no NUL character."""
    if "\x00" in id + route + name:
        raise InvalidMessage(
            f"far tier: {id!r} has a NUL character in its id, route or name, which PostgreSQL text cannot hold: "
            "park it within the horizon, or give it another id"
        )


@dataclass(frozen=True)
class FarRow:
    """One far message as the table holds it."""

    id: str
    due_ms: int
    token: int
    record: bytes
