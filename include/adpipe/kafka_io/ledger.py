"""Where a stream job's committed input offsets are: its ledger group, and
what the ledger's commits say (the last batch's watermark and output ends)
and leave undone (the job's lag on its raw topic). The stream job writes
the ledger in each batch's transaction (adpipe.stream.sink); loads, verify,
status and the supervisor read it through these."""

from __future__ import annotations

import json

from adpipe.kafka_access import Region
from adpipe.kafka_io.groups import group_commits
from adpipe.kafka_io.offsets import end_offsets
from adpipe.settings import Settings


def ledger_group(job_id: str) -> str:
    """The consumer group a stream job commits each micro-batch's input
    offsets to, inside the batch's output transaction: its readers take the
    raw records below these offsets as final (counted, late or in the DLQ)."""
    return f"adpipe-agg-{job_id}"


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
