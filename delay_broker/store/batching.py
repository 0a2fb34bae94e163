"""Parks of one new message each, from threads (or greenlets) of one process parking at once, sent together: one
round trip carries the one-message scripts of every park waiting, and each caller returns once its own park is
answered, with its own result or error."""

from __future__ import annotations

import threading
from typing import Any

from ..errors import DelayBrokerError, StoreUnavailable
from ..records import ParkResult
from .encoding import Parcel
from .parking import RedisParking

MAX_TOGETHER = 64
"""Parks sent in one round trip at most: past a few dozen a round trip gains little, and its callers all wait
for the last reply."""


class _Waiting:
    """One park waiting to be sent, and then its answer."""

    __slots__ = ("answer", "lead", "parcel", "ready")

    def __init__(self, parcel: Parcel) -> None:
        self.parcel = parcel
        self.ready = threading.Lock()
        self.ready.acquire()  # released once answered, or once it is this park's turn to send
        self.lead = False
        self.answer: Any = None


class ParkBatcher:
    """Sends the one-message parks of concurrent callers together.

    A caller that finds no round trip under way sends one with every park waiting (its own included); the
    others wait for its answer. When it is answered and more parks came meanwhile, the first of them sends the
    next round trip: no caller sends for longer than its own batch. A lone caller sends its park alone, as it
    would without this.
    """

    def __init__(self, parking: RedisParking) -> None:
        self.parking = parking
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []
        self._sending = False

    def park(self, parcel: Parcel) -> ParkResult | None:
        """:meth:`RedisParking.park_one`, sent with the parks of other callers waiting at the same time."""
        waiting = _Waiting(parcel)
        with self._lock:
            self._waiting.append(waiting)
            lead = not self._sending
            self._sending = True
        if not lead:
            waiting.ready.acquire()
            lead = waiting.lead
        if lead:
            self._send()
        if isinstance(waiting.answer, BaseException):
            raise waiting.answer
        return waiting.answer  # type: ignore[no-any-return]

    def _send(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting[:MAX_TOGETHER], self._waiting[MAX_TOGETHER:]
        try:
            self._answer(batch)
        finally:
            with self._lock:
                following = self._waiting[0] if self._waiting else None
                self._sending = following is not None
            for waiting in batch:
                if waiting.ready.locked():
                    waiting.ready.release()
            if following is not None:
                following.lead = True
                following.ready.release()

    def _answer(self, batch: list[_Waiting]) -> None:
        """Each park's answer: its result (None: left to park.lua), or the error it raises."""
        if len(batch) == 1:
            try:
                batch[0].answer = self.parking.park_one(batch[0].parcel)
            except BaseException as error:  # its caller's to raise, in its own thread
                batch[0].answer = error
            return
        try:
            made = [(waiting, self.parking.one_call(waiting.parcel)) for waiting in batch]
            # A park that takes park.lua's path (an id a reshard moves) is answered None: its caller parks it so.
            sent = [(waiting, call) for waiting, call in made if call is not None]
            replies = self.parking.runner.run_together([(c.script, c.shard, c.args, c.extra) for _, c in sent])
        except BaseException as error:  # the round trip failed: every park of it raises the error
            for waiting in batch:
                waiting.answer = error
            return
        for (waiting, call), reply in zip(sent, replies, strict=True):
            if isinstance(reply, StoreUnavailable):
                waiting.answer = reply
            elif isinstance(reply, DelayBrokerError):
                waiting.answer = None  # a refusal: park.lua, which wrote nothing either, says what it is
            else:
                try:
                    waiting.answer = self.parking.one_result(call, waiting.parcel, reply)
                except BaseException as error:
                    waiting.answer = error
