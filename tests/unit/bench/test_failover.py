"""The failover benchmark's summary (bench.failover): percentiles over the
faults' seconds, and the zombies that exited fenced."""

from __future__ import annotations

from bench.failover import FailoverRun


def test_the_summary_takes_the_median_the_99th_percentile_and_the_worst() -> None:
    run = FailoverRun("STOP", 5.0, seconds=[9.0, 7.5, 8.25, 30.0, 7.0, 8.1, 7.2, 7.9, 8.1, 7.7],
                      zombie_exits=[4, 4, None, 4, 1, 4, 4, 4, 4, 4])
    summary = run.summary()
    assert (summary["faults"], summary["p50_s"], summary["p99_s"], summary["max_s"]) == (10, 8.0, 30.0, 30.0)
    assert summary["zombies_fenced"] == 8
    assert summary["seconds"][:3] == [9.0, 7.5, 8.2]
    assert FailoverRun("KILL", 5.0).summary()["p50_s"] is None


def test_a_part_counts_as_moved_on_only_past_where_each_partition_ended_at_the_kill() -> None:
    from bench.broker_failover import _past

    ends = {0: 10, 1: 0, 2: 7}
    assert not _past(ends, {0: 10, 1: 1, 2: 8})  # partition 0 at its end: nothing after the kill handled
    assert not _past(ends, {0: 11, 1: 1})  # partition 2 not read yet
    assert _past(ends, {0: 11, 1: 1, 2: 8})
    assert not _past({}, {0: 5})  # no partitions known: never "moved on"


def test_first_after_counts_only_what_began_after_the_kill_and_each_key_once() -> None:
    from bench.broker_failover import FirstAfter

    seen = FirstAfter()
    seen.note(0, 5.0)  # before any arm: not counted
    seen.arm(100.0)
    seen.note(0, 99.0)  # sent before the kill, acknowledged after: not progress
    assert seen.all_at({0}) is None
    seen.note(0, 100.5)
    first = seen.all_at({0})
    assert first is not None
    seen.note(0, 101.0)
    assert seen.all_at({0}) == first  # the first moment is kept
    assert seen.all_at({0, 1}) is None
    seen.note(1, 102.0)
    assert seen.all_at({0, 1}) is not None and seen.all_at({0, 1}) >= first
    seen.arm(200.0)
    assert seen.all_at({0}) is None  # a new kill: from scratch


def _batch_line(n: int, offsets: int, ms: int) -> str:
    return (f"2026-11-23 22:40:0{n},000 INFO adpipe.stream: batch {n}: input offsets {offsets}, windows emitted 0, "
            f"dlq 0, late 0 (repeats skipped 0), watermark 1970-01-01T00:00:00Z, transaction t committed in 9 ms "
            f"(batch {ms} ms)\n")


def test_first_batches_of_a_cold_start_and_of_each_takeover_beside_a_steady_one() -> None:
    from bench.failover import TOOK_OVER, first_batches

    cold = _batch_line(0, 5, 4200) + _batch_line(1, 5, 300) + _batch_line(2, 5, 340)
    warm = _batch_line(3, 5, 900) + f"... {TOOK_OVER}lock released) ...\n" + _batch_line(4, 5, 320)
    never = _batch_line(5, 5, 7000)  # a standby stopped before it took over: not a takeover
    assert first_batches([cold, warm, never]) == {
        "cold_first_batch_ms": 4200,
        "takeover_first_batch_ms": [900],
        "steady_batch_ms": 320,  # the median of the drivers' medians of later batches: 320 (300, 340), 320
    }
    assert first_batches([]) == {"cold_first_batch_ms": None, "takeover_first_batch_ms": [], "steady_batch_ms": None}
