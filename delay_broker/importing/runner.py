"""The import itself: read a broker queue, park what is due later than the threshold, then take it off the queue.

Every message goes through the same steps, each one safe to interrupt (see :mod:`delay_broker.importing`): taken
out of the consumers' reach (:meth:`Source.take`), parked with ``on_conflict="keep"``, and only then removed from
the broker (:meth:`Source.release`). A run killed at any point leaves each message in the queue, taken, or parked
and taken; the next run parks what is taken again, which keeps what the store holds, and removes it.
"""

from __future__ import annotations

import logging

from ..clock import ms_to_datetime
from ..errors import InvalidDelay, InvalidMessage
from ..records import ParkRequest, ParkResult
from ..store import DelayStore
from .model import DUE_SOON, GONE, TAKEN_MEANWHILE, Found, Item, QueueReport, Source

logger = logging.getLogger("delay_broker.importing")


class Importer:
    """Moves the delayed messages of broker queues into a delay store.

    Parameters:
      store: the delay store the application parks in.
      threshold_ms: a message is moved when it is due more than this many milliseconds from now (Redis clock);
        the others stay in their queue, untouched.
      dry_run: read and report, change nothing.
      record_routes: record each moved message's route in the store (Celery's promoters deliver to the routes
        the app declares and to those recorded).
    """

    def __init__(
        self, store: DelayStore, threshold_ms: int, *, dry_run: bool = True, record_routes: bool = False
    ) -> None:
        self.store = store
        self.threshold_ms = threshold_ms
        self.dry_run = dry_run
        self.record_routes = record_routes

    def run(self, source: Source) -> QueueReport:
        """Import one queue; what was read and not moved goes back to it, whatever happens."""
        report = QueueReport(source.name, self.dry_run)
        try:
            for batch in source.recover():
                self._recover(source, batch, report)
            for batch in source.scan():
                self._import(source, batch, report)
        finally:
            source.finish()
        report.notes.extend(source.notes())
        if self.dry_run and report.recovered:
            report.notes.append(f"{report.recovered:,} taken by an interrupted import: --yes finishes them")
        return report

    def _recover(self, source: Source, batch: list[Item], report: QueueReport) -> None:
        """What an interrupted run took and did not release: parked whatever its due time (it left the queue
        already, and may be parked already), unless it cannot be."""
        if self.dry_run:
            report.recovered += len(batch)
            return
        gone = [item for item in batch if item.found == GONE]
        source.release(gone)
        unreadable = [item for item in batch if isinstance(item.found, str) and item.found != GONE]
        for item in unreadable:
            report.left[str(item.found)] += 1
        source.give_back(unreadable)
        movers = [item for item in batch if isinstance(item.found, Found)]
        before = report.moved + report.already
        self._park(source, movers, report)
        report.recovered += report.moved + report.already - before

    def _import(self, source: Source, batch: list[Item], report: QueueReport) -> None:
        report.examined += len(batch)
        now_ms = self.store.now_ms()
        movers = []
        for item in batch:
            found = item.found
            if isinstance(found, str):
                report.left[found] += 1
            elif found.due_ms - now_ms <= self.threshold_ms:
                report.left[DUE_SOON] += 1
            else:
                movers.append(item)
        if self.dry_run:
            report.moved += len(movers)
            for item in movers:
                report.saw_due(_found(item).due_ms)
            return
        taken = source.take(movers)
        if len(taken) < len(movers):
            report.left[TAKEN_MEANWHILE] += len(movers) - len(taken)
        self._park(source, taken, report)

    def _park(self, source: Source, items: list[Item], report: QueueReport) -> None:
        """Park ``items`` (each one's own id, due time and envelope, keeping what the store holds), release those
        parked and give back those the store refused."""
        if not items:
            return
        if self.record_routes:
            self.store.record_routes({_found(item).envelope.route for item in items})
        results = self._park_each(items)
        parked = [item for item in items if isinstance(results[id(item)], ParkResult)]
        refused = [item for item in items if not isinstance(results[id(item)], ParkResult)]
        for item in parked:
            result = results[id(item)]
            assert isinstance(result, ParkResult)
            if result.outcome == "new":
                report.moved += 1
            else:
                report.already += 1
            report.saw_due(_found(item).due_ms)
        source.release(parked)
        for item in refused:
            report.refused[_found(item).id] = str(results[id(item)])
        source.give_back(refused)

    def _park_each(self, items: list[Item]) -> dict[int, ParkResult | str]:
        """Each item's park result, or why the store refused it. One call for the batch; when the store refuses
        the batch for one message (too large, due beyond ``max_delay``), each is parked alone to find which."""
        requests = [_request(_found(item)) for item in items]
        try:
            results = self.store.park_many(requests, on_conflict="keep")
            return {id(item): result for item, result in zip(items, results, strict=True)}
        except (InvalidMessage, InvalidDelay):
            pass
        answers: dict[int, ParkResult | str] = {}
        for item, request in zip(items, requests, strict=True):
            try:
                answers[id(item)] = self.store.park_many([request], on_conflict="keep")[0]
            except (InvalidMessage, InvalidDelay) as error:
                answers[id(item)] = str(error) or type(error).__name__
        return answers


def _found(item: Item) -> Found:
    assert isinstance(item.found, Found)
    return item.found


def _request(found: Found) -> ParkRequest:
    return ParkRequest(found.id, found.envelope, due=ms_to_datetime(found.due_ms))
