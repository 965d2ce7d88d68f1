"""``python -m bench --failover --hosts N``: what it reads from the drivers'
logs, and what its summary counts as a finding."""

from __future__ import annotations

from bench.host_failover import Fault, batches, summarize, took_over

STANDBY_LOG = """\
04:10:01 INFO adpipe.stream: standby: waiting to lead job j (group g)
04:10:09 INFO adpipe.stream: standby: warm in 31.2 s
04:11:15 INFO adpipe.stream: batch 41: input offsets 6, windows emitted 0, dlq 0, late 0 transaction t committed
04:11:15 INFO adpipe.stream: standby: took over (pid 7 on host-1 left the group); batch 41 done 1.9 s after taking over
04:11:16 INFO adpipe.stream: batch 42: input offsets 5, windows emitted 0, dlq 0, late 0 transaction t committed
"""


def test_the_batches_and_the_takeover_come_from_the_drivers_log_lines() -> None:
    assert batches(STANDBY_LOG) == [41, 42]
    line = took_over(STANDBY_LOG)
    assert line is not None
    assert (line["reason"], int(line["batch"]), float(line["s"])) == ("pid 7 on host-1 left the group", 41, 1.9)
    assert took_over(STANDBY_LOG.replace("took over", "taking over")) is None
    assert batches("") == []


def test_a_batch_of_the_faulted_driver_at_or_past_the_standbys_first_is_a_double_commit() -> None:
    # A commit in flight at the fault, logged just after it, is below the standby's first batch.
    assert not Fault("cut", "host-1", 8.0, 2.0, standby_batch=41, zombie_batches=[40]).double_commit
    assert Fault("cut", "host-1", 8.0, 2.0, standby_batch=41, zombie_batches=[40, 41]).double_commit
    assert not Fault("kill", "host-1", 8.0, 2.0, standby_batch=None, zombie_batches=[50]).double_commit


def test_the_summary_splits_by_kind_and_counts_the_findings() -> None:
    faults = [
        Fault("cut", "host-1", 9.0, 2.0, 10, zombie_exit=4),
        Fault("cut_brokers", "host-2", 8.0, 1.0, 20, zombie_exit=0, zombie_batches=[19, 20]),
        Fault("kill", "host-1", 7.0, 1.5, 30),
        Fault("cut", "host-2", None),  # not taken over in time
    ]
    summary = summarize(faults)
    assert (summary["faults"], summary["p50_s"], summary["max_s"]) == (3, 8.0, 9.0)
    assert summary["by_kind"]["cut"]["faults"] == 1 and summary["by_kind"]["kill"]["p50_s"] == 7.0
    assert summary["leadership_p50_s"] == 7.0  # 9-2, 8-1, 7-1.5: 7, 7, 5.5
    assert summary["first_batch_p50_s"] == 1.5
    assert (summary["zombies"], summary["zombies_fenced"]) == (3, 1)
    assert summary["double_commits"] == 1 and summary["untimed"] == 1
    row = faults[1].row()
    assert row["leadership_s"] == 7.0 and row["zombie_batches_after_fault"] == [19, 20]
