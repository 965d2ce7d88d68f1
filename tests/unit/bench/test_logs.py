"""make bench's reading of stream logs (bench.logs)."""

from __future__ import annotations

from bench.logs import batch_stats

LOG = """\
2026-11-23 22:40:01,001 INFO adpipe.stream: stream job x started: query q, checkpoint c, available-now
2026-11-23 22:40:05,123 INFO adpipe.stream: batch 0: input offsets 25000, windows emitted 0, dlq 250, late 0 \
(repeats skipped 0), watermark 1970-01-01T00:00:00Z, transaction adpipe-agg-x committed in 412 ms (batch 3120 ms)
2026-11-23 22:40:07,456 INFO adpipe.stream: batch 1: input offsets 24000, windows emitted 120, dlq 240, late 3 \
(repeats skipped 1), watermark 2026-11-22T12:10:00Z, transaction adpipe-agg-x committed in 980 ms (batch 2210 ms)
2026-11-23 22:40:08,001 INFO adpipe.stream: batch 2: input offsets 0, windows emitted 30, dlq 0, late 0 \
(repeats skipped 0), watermark 2026-11-22T12:30:00Z, transaction adpipe-agg-x skipped (already committed) in 3 ms \
(batch 150 ms)
"""


def test_batch_stats_reads_the_job_log_lines() -> None:
    assert batch_stats(LOG) == {
        "batches": 3,
        "batches_with_input": 2,
        "max_batch_offsets": 25000,
        "max_transaction_ms": 980,
        "max_batch_ms": 3120,
        "first_batch_ms": 3120,
        "median_steady_batch_ms": 2210,
    }


def test_batch_stats_of_a_log_without_batches() -> None:
    assert batch_stats("nothing\n")["batches"] == 0
