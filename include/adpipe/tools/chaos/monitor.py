"""The run's view of its progress, sampled on a thread of its own: the
stream job's committed input and lag, the budget service's, the ledger's
batch boundaries, and which hours the stream has closed."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from adpipe import kafka_io
from adpipe.settings import Settings

from . import check

log = logging.getLogger("adpipe.tools.chaos")


def budget_offsets(settings: Settings) -> dict[int, int]:
    """The budget service's next offset per partition of the aggregates
    topic, from its database (its offsets live there, in the transaction
    that charges; the Kafka group's commits are for monitoring only)."""
    import sqlalchemy as sa

    engine = sa.create_engine(settings.budget_db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT kafka_partition, next_offset FROM budget_offsets WHERE group_id = :g AND topic = :t"),
                {"g": settings.budget_group, "t": settings.topics.aggregates},
            ).all()
    except sa.exc.SQLAlchemyError:  # no table before the first batch
        return {}
    finally:
        engine.dispose()
    return {int(p): int(o) for p, o in rows}


@dataclass
class Monitor:
    """Samples progress once a second: the stream job's committed input and
    lag, the budget group's committed input."""

    settings: Settings  # the run's
    stream_committed: int = 0
    stream_lag: int = 0
    max_stream_lag: int = 0
    budget_committed: int = 0
    budget_lag: int = 0
    # When a sample first saw the stream job's committed input grow
    # (monotonic), and the start of the sample before it: the commit
    # landed between the two.
    stream_progress_at: float = 0.0
    stream_progress_since: float = 0.0
    # Since when input waits for the stream job (its lag last rose from 0):
    # an idle job is not stalled the moment new input arrives.
    stream_waiting_since: float = 0.0
    budget_progress_at: float = 0.0
    budget_progress_since: float = 0.0
    sampled_at: float = 0.0
    sample_started_at: float = 0.0  # the last sample's start (monotonic)
    hours: list[str] = field(default_factory=list)
    closed_hours: set[str] = field(default_factory=set)
    errors: int = 0
    # The ledger's batch boundaries as sampled (the verdict bounds each
    # batch's watermark with them): batch id -> boundary.
    boundaries: dict[int, check.LedgerBoundary] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        s = self.settings
        started = time.monotonic()
        try:
            commits = kafka_io.stream_commits(s)
            lag = sum(kafka_io.stream_lag(s, commits).values())
            done = sum(offset for offset, _ in commits.values())
            budget_done = sum(budget_offsets(s).values())
            # Each transaction ends in a commit marker the service never
            # reads: a lag of one per partition is caught up.
            budget_end = sum(kafka_io.end_offsets(s.kafka, s.topics.aggregates).values())
            budget_end -= s.topic_partitions
        except Exception as exc:  # noqa: BLE001 - a broker down: sample again
            self.errors += 1
            log.debug("monitor: %s", exc)
            return
        self.note_boundary(commits)
        now = time.monotonic()
        self.sampled_at = now
        if done > self.stream_committed:
            self.stream_committed, self.stream_progress_at = done, now
            self.stream_progress_since = self.sample_started_at
        if budget_done > self.budget_committed:
            self.budget_committed, self.budget_progress_at = budget_done, now
            self.budget_progress_since = self.sample_started_at
        self.sample_started_at = started
        if lag > 0 and self.stream_lag == 0:
            self.stream_waiting_since = now
        self.stream_lag, self.budget_lag = lag, max(0, budget_end - budget_done)
        self.max_stream_lag = max(self.max_stream_lag, lag)

    def note_boundary(self, commits: dict[int, tuple[int, str]]) -> None:
        boundary = check.ledger_boundary(commits)
        if boundary is not None:
            self.boundaries[boundary.batch_id] = boundary

    def sample_hours(self) -> None:
        """Which of the run's hours the stream has closed (loads wait for it)."""
        from adpipe.lakehouse import load

        for hour in self.hours:
            if hour in self.closed_hours:
                continue
            try:
                if load.hour_closed(self.settings, load.parse_hour(hour)):
                    self.closed_hours.add(hour)
            except Exception as exc:  # noqa: BLE001 - a broker down: ask again
                log.debug("monitor: %s", exc)
                return

    def loop(self) -> None:
        """Here, not on the run's own thread: with a broker down these calls
        wait for their timeouts, and faults must keep their schedule."""
        ticks = 0
        while not self.stop.wait(1.0):
            self.sample()
            ticks += 1
            if ticks % 5 == 0:
                self.sample_hours()
