"""The stream job's event-time watermark: it waits for the slowest partition.

Spark's own watermark is the highest event time over all partitions, less
the delay. Read from a backlog in capped batches, Spark gives each
partition a share of a batch by its lag, so a partition of a few events a
minute races hours ahead in event time of one that holds a spike, and the
windows the spike has not finished close under it: its events turn late.
Here the watermark a batch runs with is

    the minimum, over the partitions that still had records to read when
    the batch was planned, of each one's highest event time read so far,
    less ADPIPE_WATERMARK_DELAY_S (never lower than the last batch's),

where "still had records to read" is known from the batch's own planned
offsets (``offsets/N`` against ``offsets/N-1``), never from a wall clock.
A partition with nothing waiting does not hold it back, and with none
waiting (the batch after a backlog's last, or a quiet stream) it is the
highest event time read, as Spark's. Two more rules keep one partition
from stopping every window: a partition whose last read gave no valid
event (only malformed records, or only aborted transactions) does not hold
it back, and one never read holds it for the one batch that first reads it.
``ADPIPE_WATERMARK_ALIGNMENT=off`` takes the highest event time over all
partitions instead (Spark's rule; ``make bench`` compares the two).

What a batch read is recorded after it, in the checkpoint
(``adpipe/progress/N``: the watermark batch N ran with and each partition's
progress after it), before the batch commits; a replay of batch N reads
``adpipe/progress/N-1`` and computes the very same watermark."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from adpipe.stream.offset_log import CheckpointFiles, CheckpointVersionError, last_committed_batch

log = logging.getLogger("adpipe.stream")

PROGRESS_DIR = "adpipe/progress"
# Progress entries kept behind the newest (Spark keeps 100 batches of its logs by default).
PROGRESS_KEPT = 100
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PartitionProgress:
    """A raw-topic partition after a batch: the highest valid event time
    read from it so far (None before its first valid event), and whether
    its last read gave a valid event."""

    event_ms: int | None
    last_read_valid: bool


@dataclass(frozen=True)
class Progress:
    """Where the job stands after batch ``batch_id``: the watermark that batch
    ran with, and every partition read so far."""

    batch_id: int
    watermark_ms: int
    partitions: dict[int, PartitionProgress] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": FORMAT_VERSION,
                "batch_id": self.batch_id,
                "watermark_ms": self.watermark_ms,
                "partitions": {
                    str(p): {"event_ms": s.event_ms, "last_read_valid": s.last_read_valid}
                    for p, s in sorted(self.partitions.items())
                },
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Progress:
        body = json.loads(text)
        return cls(
            int(body["batch_id"]),
            int(body["watermark_ms"]),
            {
                int(p): PartitionProgress(
                    None if entry["event_ms"] is None else int(entry["event_ms"]), bool(entry["last_read_valid"])
                )
                for p, entry in body["partitions"].items()
            },
        )


def batch_watermark(previous: Progress | None, waiting: Iterable[int], delay_ms: int, aligned: bool = True) -> int:
    """The watermark a batch runs with (module doc): ``previous`` is the
    progress after the batch before it (None before the first batch),
    ``waiting`` the partitions its planned offsets read."""
    if previous is None:
        return 0
    known = previous.partitions
    highest = [s.event_ms for s in known.values() if s.event_ms is not None]
    candidate: int | None = max(highest) if highest else None
    if aligned:
        holding = [p for p in waiting if p not in known or known[p].last_read_valid]
        if any(p not in known for p in holding):
            candidate = None  # a partition read for the first time: hold for this batch
        elif holding:
            candidate = min(known[p].event_ms for p in holding)  # type: ignore[type-var] - valid reads have one
    if candidate is None:
        return previous.watermark_ms
    return max(previous.watermark_ms, candidate - delay_ms)


def after_batch(
    previous: Progress | None,
    batch_id: int,
    watermark_ms: int,
    planned: Iterable[int],
    read: Mapping[int, int | None],
) -> Progress:
    """The progress after ``batch_id``, which ran with ``watermark_ms``:
    ``planned`` are the partitions its offsets read, ``read`` the highest
    valid event time each gave (None: records, none valid; absent: none)."""
    partitions = dict(previous.partitions) if previous is not None else {}
    for partition in planned:
        before = partitions.get(partition)
        highest = read.get(partition)
        event_ms = before.event_ms if before is not None else None
        if highest is not None:
            event_ms = highest if event_ms is None else max(event_ms, highest)
        partitions[partition] = PartitionProgress(event_ms, highest is not None)
    return Progress(batch_id, watermark_ms, partitions)


def check_progress(files: CheckpointFiles) -> None:
    """Before the query starts: a checkpoint with committed batches must
    have the progress entry of its last one. One without was written by a
    version of the job whose watermark was Spark's and whose one stateful
    operator kept its state otherwise; this version cannot resume it."""
    last = last_committed_batch(files)
    if last is not None and files.read(f"{PROGRESS_DIR}/{last}") is None:
        raise CheckpointVersionError(
            f"the checkpoint {files} was written by an earlier version of the stream job (its batch {last} has no "
            f"{PROGRESS_DIR} entry): this version cannot resume its state. With the job stopped, run "
            "`adpipe stream --upgrade-checkpoint` once, then start it (docs/operations.md, 'Upgrading the stream job')."
        )


class ProgressLog:
    """The progress entries in a query's checkpoint (``adpipe/progress/N``),
    with the last one read or written kept in memory."""

    def __init__(self, files: CheckpointFiles) -> None:
        self.files = files
        self._last: Progress | None = None

    def before(self, batch_id: int) -> Progress | None:
        """The progress after ``batch_id - 1``: before batch 0 none, but for
        an upgraded checkpoint (``adpipe/progress/-1``, adpipe.stream.upgrade)."""
        if batch_id == 0:
            raw = self.files.read(f"{PROGRESS_DIR}/-1")
            return None if raw is None else Progress.from_json(raw.decode())
        if self._last is not None and self._last.batch_id == batch_id - 1:
            return self._last
        raw = self.files.read(f"{PROGRESS_DIR}/{batch_id - 1}")
        if raw is None:
            raise CheckpointVersionError(
                f"the checkpoint {self.files} has no {PROGRESS_DIR}/{batch_id - 1}: it was written by an earlier "
                "version of the job; run `adpipe stream --upgrade-checkpoint` once (docs/operations.md, "
                "'Upgrading the stream job')."
            )
        self._last = Progress.from_json(raw.decode())
        return self._last

    def at(self, batch_id: int) -> Progress | None:
        """The entry of ``batch_id``, if it was written."""
        raw = self.files.read(f"{PROGRESS_DIR}/{batch_id}")
        return None if raw is None else Progress.from_json(raw.decode())

    def write(self, progress: Progress) -> None:
        """Written before the batch commits (a replay writes the same again);
        entries more than PROGRESS_KEPT behind are deleted."""
        self.files.write(f"{PROGRESS_DIR}/{progress.batch_id}", progress.to_json())
        self._last = progress
        stale = progress.batch_id - PROGRESS_KEPT
        if stale >= 0 and stale % 10 == 0:
            for batch_id in range(max(0, stale - 10), stale + 1):
                self.files.delete(f"{PROGRESS_DIR}/{batch_id}")
