"""What the budget service reports of itself: the Prometheus metrics
(:class:`adpipe.metrics.BudgetMetrics`, served at /metrics), one log line
per batch (operators grep it, and `make bench` reads it:
``bench.logs.budget_log_stats``), and the run's totals, logged when
it stops."""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from confluent_kafka import Consumer

from adpipe import metrics
from adpipe.budget.assignment import Assignment
from adpipe.budget.batch import BatchResult
from adpipe.money import format_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

COUNTED = (
    "records", "applied", "revised", "duplicates", "superseded", "already_applied", "quarantined", "conflicts",
    "rejected",
)


class ServiceStats:
    """The metrics, batch log lines and totals of one service run."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.totals: dict[str, int] = defaultdict(int)
        self.metrics = metrics.budget(settings)

    def serve(self) -> None:
        """The /metrics endpoint (once per process)."""
        metrics.serve(metrics.BUDGET, self.settings)

    def count(self, result: BatchResult) -> None:
        """Add a batch to the run's totals."""
        for name in COUNTED:
            self.totals[name] += getattr(result, name)
        self.totals["paused"] += len(result.paused)
        self.totals["resumed"] += len(result.transitions) - len(result.paused)

    def batch(self, number: int, result: BatchResult, started: float) -> None:
        """The metrics and the log line of batch ``number``, begun at
        ``started`` (``time.monotonic``)."""
        self.metrics.batch_applied(result, time.monotonic() - started)
        log.info(
            "batch %d: %d records: %d applied (spend +%s; %d revisions charged by difference), %d duplicate "
            "record_uuids skipped, %d older revisions skipped, %d already applied, "
            "%d quarantined (%d malformed, %d rejected, %d conflicts), %d ads paused%s, %d resumed; offsets %s; "
            "%.0f ms",
            number,
            result.records,
            result.applied,
            format_micros(result.spend_added_micros),
            result.revised,
            result.duplicates,
            result.superseded,
            result.already_applied,
            result.quarantined,
            result.malformed,
            result.rejected,
            result.conflicts,
            len(result.paused),
            (" (" + ", ".join(f"{a}@{p}" for a, p in result.paused[:10]) + ")") if result.paused else "",
            len(result.transitions) - len(result.paused),
            dict(sorted(result.next_offsets.items())),
            (time.monotonic() - started) * 1000,
        )

    def positions(self, consumer: Consumer, assignment: Assignment) -> None:
        """The assigned partitions' database offsets and lag (gauges)."""
        self.metrics.positions(consumer, assignment.topic, assignment.started_from, assignment.at_eof)

    def stopped(self, batches: int) -> None:
        log.info(
            "budget service stopped: %d batches, %s",
            batches,
            ", ".join(f"{k} {v}" for k, v in sorted(self.totals.items())),
        )
