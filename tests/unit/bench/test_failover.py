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
