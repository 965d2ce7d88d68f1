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
