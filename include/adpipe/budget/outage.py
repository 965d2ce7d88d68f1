"""A database outage, waited out: every database transaction of the budget
service runs through :meth:`OutageGuard.with_db`.

A **transient** fault (``db.fault_kind``: connection lost or refused,
serialization failure, deadlock, admin shutdown, statement timeout) pauses
consumption (:meth:`adpipe.budget.assignment.Assignment.pause`: the consumer
keeps polling, so the group does not rebalance) and the same transaction is
retried with backoff for up to ``ADPIPE_BUDGET_DB_OUTAGE_S``; then
:class:`DatabaseOutage` (the service exits 1; its partitions move to the
others). When the database answers again (a success, or a refusal raised to the
caller), consumption resumes from the database's offsets. SIGTERM while waiting raises :class:`StopRequested`.
Other faults propagate at once: **data** to the batch splitting of
:mod:`adpipe.budget.commit`, **fatal** (a missing table, a permission) out
of the service.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from adpipe.budget import db
from adpipe.budget.assignment import Assignment
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

T = TypeVar("T")
MAX_BACKOFF_S = 15.0


class DatabaseOutage(RuntimeError):
    """The database stayed unavailable longer than ADPIPE_BUDGET_DB_OUTAGE_S."""


class StopRequested(RuntimeError):
    """SIGTERM while waiting out an outage: stop without applying."""


class OutageGuard:
    """Retries database transactions through an outage, with the
    assignment's consumption paused meanwhile; see the module doc."""

    def __init__(self, settings: Settings, stop: threading.Event, assignment: Assignment) -> None:
        self.settings = settings
        self.stop = stop
        self.assignment = assignment

    def with_db(self, what: str, action: Callable[[], T]) -> T:
        """``action`` (a database transaction), retried while the fault is
        transient, for up to ADPIPE_BUDGET_DB_OUTAGE_S, with consumption
        paused; other faults propagate."""
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                result = action()
            except Exception as exc:
                if db.fault_kind(exc) != db.TRANSIENT:
                    if deadline is not None:
                        # It answers again, with a refusal (data) or an error
                        # (fatal): the outage is over either way. Left
                        # paused, the service would poll and charge nothing.
                        log.info("%s: the database answers again after %d attempts, with %s; consumption resumes",
                                 what, attempt + 1, type(exc).__name__)
                        self.assignment.resume()
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.settings.budget_db_outage_s
                    log.error(
                        "%s: database unavailable (%s); %s, retrying for up to %d s",
                        what,
                        str(exc).splitlines()[0],
                        "consumption paused" if self.assignment.consumer is not None else "not consuming yet",
                        self.settings.budget_db_outage_s,
                    )
                    self.assignment.pause()
                if now >= deadline:
                    raise DatabaseOutage(
                        f"{what}: the database was unavailable for more than {self.settings.budget_db_outage_s} s "
                        f"(ADPIPE_BUDGET_DB_OUTAGE_S): {str(exc).splitlines()[0]}"
                    ) from exc
                attempt += 1
                wait = min(MAX_BACKOFF_S, 0.5 * 2**attempt, max(0.0, deadline - now))
                log.warning("%s: attempt %d failed (%s); next in %.1f s", what, attempt, type(exc).__name__, wait)
                self._idle(wait)
                continue
            if deadline is not None:
                log.info("%s: the database answers again after %d attempts; consumption resumes", what, attempt + 1)
                self.assignment.resume()
            return result

    def _idle(self, seconds: float) -> None:
        """Wait, polling the (paused) consumer so the group keeps this member;
        whatever it returns is dropped (re-read after the resume)."""
        end = time.monotonic() + seconds
        while True:
            if self.stop.is_set():
                raise StopRequested("stop requested while the database was unavailable")
            left = end - time.monotonic()
            if left <= 0:
                return
            consumer = self.assignment.consumer
            if consumer is not None:
                consumer.consume(100, min(1.0, left))
            else:
                time.sleep(min(1.0, left))
