"""Where a stream job's committed input offsets are: its ledger group, and
what the ledger's commits say (the last batch's watermark and output ends)
and leave undone (the job's lag on its raw topic, in records and seconds). The stream job writes
the ledger in each batch's transaction (adpipe.stream.sink); loads, verify,
status and the supervisor read it through these."""

from __future__ import annotations

import json
import time

from adpipe.kafka_access import Region
from adpipe.kafka_io.groups import group_commits
from adpipe.kafka_io.offsets import end_offsets
from adpipe.kafka_io.records import first_timestamps
from adpipe.settings import Settings


def ledger_group(job_id: str) -> str:
    """The consumer group a stream job commits each micro-batch's input
    offsets to, inside the batch's output transaction: its readers take the
    raw records below these offsets as final (counted, late or in the DLQ)."""
    return f"adpipe-agg-{job_id}"


def leadership_group(job_id: str) -> str:
    """The stream job's leadership group, and the name of its one-partition
    topic (:mod:`adpipe.stream.leadership`): beside its ledger group, under
    the same access rights' prefix."""
    return f"{ledger_group(job_id)}-leader"


def committed_watermark(commits: dict[int, tuple[int, str]]) -> int | None:
    """The watermark (epoch ms) of the last batch in a stream job's ledger
    commits (:func:`stream_commits`; each carries its batch's metadata), or
    None when it has committed nothing."""
    marks = [json.loads(meta).get("watermark_ms", 0) for _offset, meta in commits.values() if meta]
    return max(marks) if marks else None


def committed_outputs(commits: dict[int, tuple[int, str]]) -> dict[str, dict[int, int]]:
    """Per output topic and partition, the offset after the last record of
    the last batch in a stream job's ledger commits (the ``out`` of its
    metadata, adpipe.stream.sink_ledger.ledger_metadata); empty when the ledger
    does not say."""
    entries = [json.loads(meta) for _offset, meta in commits.values() if meta]
    if not entries:
        return {}
    last = max(entries, key=lambda e: e.get("batch_id", -1))
    return {topic: {int(p): int(end) for p, end in ends.items()} for topic, ends in last.get("out", {}).items()}


def stream_commits(region: Settings | Region, timeout_s: float = 30.0) -> dict[int, tuple[int, str]]:
    """A region's stream job's committed (offset, metadata) per raw-topic
    partition (see :func:`ledger_group`)."""
    return group_commits(region.kafka, ledger_group(region.job_id), region.topics.events, timeout_s)


def stream_lag(
    region: Settings | Region, commits: dict[int, tuple[int, str]] | None = None, timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition of a region's raw topic: records its stream job has not
    committed yet (a partition it never committed counts from zero).
    ``commits``: its :func:`stream_commits`, when the caller has read them."""
    ends = end_offsets(region.kafka, region.topics.events, timeout_s=timeout_s)
    done = stream_commits(region, timeout_s) if commits is None else commits
    return {p: max(0, end - done.get(p, (0, ""))[0]) for p, end in sorted(ends.items())}


def stream_lag_seconds(
    region: Settings | Region,
    lag_by_partition: dict[int, int],
    commits: dict[int, tuple[int, str]] | None = None,
    now: float | None = None,
    timeout_s: float = 30.0,
) -> float | None:
    """How long the oldest raw record a region's stream job has not
    committed has waited: now minus its timestamp (the broker's, on a raw
    topic adpipe created; the producer's on a ``CreateTime`` topic). 0 with
    no lag; None when no waiting record is readable."""
    starts = {p: n for p, n in lag_by_partition.items() if n > 0}
    if not starts:
        return 0.0
    done = stream_commits(region, timeout_s) if commits is None else commits
    stamps = first_timestamps(region.kafka, region.topics.events, {p: done.get(p, (0, ""))[0] for p in starts},
                              timeout_s)
    waiting = [t for t in stamps.values() if t > 0]
    if not waiting:
        return None
    return max(0.0, (time.time() if now is None else now) - min(waiting) / 1000)
