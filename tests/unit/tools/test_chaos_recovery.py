"""How the chaos run judges recovery from a fault: from the progress its
monitor samples, never from progress that may predate the fault."""

from __future__ import annotations

import pytest
from adpipe.tools import chaos


@pytest.fixture
def run(chaos_run: chaos.ChaosRun) -> chaos.ChaosRun:
    return chaos_run


def _sleeper(run: chaos.ChaosRun, name: str) -> chaos.Part:
    part = chaos.Part(name, ["sleep", "30"], dict(run.ctx.env), run.ctx.logs)
    part.start()
    return part


def test_a_commit_seen_by_the_first_sample_after_a_fault_is_no_recovery_from_it(run: chaos.ChaosRun) -> None:
    """The monitor samples once a second: a commit it first sees right after
    a fault may have landed before it. Recovery counts progress seen by a
    sample whose predecessor began after the fault."""
    m, t0 = run.monitor, run.clock.t0
    run.crew.budgets = [_sleeper(run, f"budget-{i}") for i in (1, 2)]
    record = chaos.FaultRecord(chaos.HOST_KILL, "host-1", 10.0, 3.0)
    run.faults.add(record)
    m.stream_lag = m.budget_lag = 5  # input waiting: no idle shortcut
    # Both moved in the sample just after the fault, the one before began before it: not yet.
    m.stream_progress_at = m.budget_progress_at = t0 + 10.5
    m.stream_progress_since = m.budget_progress_since = t0 + 9.5
    run.supervisor.judge_recovery()
    assert record.recovery_s is None
    # Both moved again, seen by samples whose predecessors began after the fault: recovered when the later was seen.
    m.stream_progress_at, m.stream_progress_since = t0 + 12.5, t0 + 11.5
    m.budget_progress_at, m.budget_progress_since = t0 + 14.5, t0 + 13.5
    run.supervisor.judge_recovery()
    assert record.recovery_s == 4.5 and not record.recovered_idle


def test_a_fault_recovered_with_no_input_waiting_is_marked_idle(run: chaos.ChaosRun) -> None:
    """Once the producer is done, a fault's part runs again with nothing to
    commit: recovered, but no takeover was timed."""
    m, t0 = run.monitor, run.clock.t0
    record = chaos.FaultRecord(chaos.STREAM_KILL, "stream", 10.0, 3.0, restored_at_s=11.0, failover=True)
    run.faults.add(record)
    run.crew.stream = _sleeper(run, "stream")
    m.stream_lag, m.sampled_at = 0, t0 + 12.0  # nothing waiting, sampled after the restore
    run.supervisor.judge_recovery()
    assert record.recovery_s is not None and record.recovered_idle
