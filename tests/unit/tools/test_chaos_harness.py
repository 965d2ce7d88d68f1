"""The chaos harness's fault accounting and restarts, with tiny real
processes (``sleep``) where a process is needed and no broker, Spark or
database: a fault is counted only when it happened, a restart that fails is
retried with backoff and then reported, never the end of the run."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.settings import load_settings
from adpipe.tools import chaos
from adpipe.tools.chaos import check as chaos_check
from adpipe.tools.chaos import drain, inject, parts, zombie


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[chaos.ChaosRun]:
    monkeypatch.setattr(parts, "RESTART_BACKOFF_S", (0.0, 0.0, 0.0))
    chaos_run = chaos.ChaosRun(load_settings({"ADPIPE_HOME": str(tmp_path)}), chaos.ChaosSpec(events=10))
    chaos_run.clock.t0 = time.monotonic()
    yield chaos_run
    chaos_run.crew.kill(chaos_run.loads.load)


def _sleeper(run: chaos.ChaosRun, name: str, seconds: str, start: bool = True) -> chaos.Part:
    part = chaos.Part(name, ["sleep", seconds], dict(run.ctx.env), run.ctx.logs)
    if start:
        part.start()
    return part


def _run_pending(run: chaos.ChaosRun, timeout_s: float = 10.0) -> None:
    """Carry out every pending action, those they schedule included."""
    deadline = time.monotonic() + timeout_s
    while run.clock.pending and time.monotonic() < deadline:
        run.injector.due()
        time.sleep(0.05)


def test_restart_backoff_grows_then_gives_up() -> None:
    waits = [chaos.restart_backoff(n) for n in range(1, len(parts.RESTART_BACKOFF_S) + 2)]
    assert waits == [5.0, 10.0, 20.0, 40.0, 80.0, None]
    assert chaos.restart_backoff(0) is None


def test_a_kill_of_a_part_that_is_not_running_is_not_a_fault(run: chaos.ChaosRun) -> None:
    planned = chaos.PlannedFault(1.0, chaos.STREAM_KILL, 0.0, 3.0)
    assert run.injector.inject(planned) is None and run.faults.records == []  # never started
    run.crew.stream = _sleeper(run, "stream", "0")
    run.crew.stream.proc.wait()  # type: ignore[union-attr]
    assert run.injector.inject(planned) is None and run.faults.records == []  # finished
    run.crew.stream = _sleeper(run, "stream", "30")
    record = run.injector.inject(planned)
    assert record is not None and run.faults.records == [record] and record.injected
    run.crew.stream.proc.wait(timeout=5)  # type: ignore[union-attr]
    assert run.crew.stream.proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]


def test_a_load_kill_counts_only_when_it_hits_a_running_load(run: chaos.ChaosRun) -> None:
    run.monitor.closed_hours = {"2026-11-22T12"}
    run.loads.part = lambda name, *_args: _sleeper(run, name, "0", start=False)  # type: ignore[method-assign]
    # No load runs: one is started and its kill deferred; it finishes first.
    planned = chaos.PlannedFault(1.0, chaos.LOAD_KILL, 0.0, 3.0)
    assert run.injector.inject(planned) is not None
    run.loads.load.proc.wait()  # type: ignore[union-attr]
    run.clock.pending = [(0.0, action, arg) for _, action, arg in run.clock.pending]
    _run_pending(run)
    # Not a fault, nor dropped: tried again on the next load, sooner into it.
    assert run.faults.records == [] and run.faults.skipped == []
    [again] = run.injector.requeued
    assert (again.kind, again.tries, again.pick) == (chaos.LOAD_KILL, 1, 0.0)
    run.injector.requeued.clear()
    # Its last try finishing first too: dropped, and the run says why.
    run.loads.load = None
    last = chaos.PlannedFault(1.0, chaos.LOAD_KILL, 0.0, 3.0, tries=chaos.LOAD_KILL_TRIES - 1)
    assert run.injector.inject(last) is not None
    run.loads.load.proc.wait()  # type: ignore[union-attr]
    run.clock.pending = [(0.0, action, arg) for _, action, arg in run.clock.pending]
    _run_pending(run)
    assert run.injector.requeued == [] and [s["kind"] for s in run.faults.skipped] == [chaos.LOAD_KILL]
    assert f"finished first, {chaos.LOAD_KILL_TRIES} times" in run.faults.skipped[0]["why"]
    # A load that still runs when the kill comes: a fault.
    run.loads.part = lambda name, *_args: _sleeper(run, name, "30", start=False)  # type: ignore[method-assign]
    run.loads.load = None
    assert run.injector.inject(planned) is not None
    run.clock.pending = [(0.0, action, arg) for _, action, arg in run.clock.pending]
    _run_pending(run)
    assert [f.kind for f in run.faults.records] == [chaos.LOAD_KILL]
    run.loads.load.proc.wait(timeout=5)  # type: ignore[union-attr]
    assert run.loads.load.proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]


def test_load_kills_carried_to_the_drain_count_only_when_they_hit_a_running_load(run: chaos.ChaosRun) -> None:
    run.loads.hours = ["2026-11-22T12", "2026-11-22T13"]
    # pick 0.0: killed 3 s into the load; the first load ends after 1 s (the
    # kill is tried again on another), the others run 30 s.
    run.faults.carried = [chaos.PlannedFault(at, chaos.LOAD_KILL, 0.0, 3.0) for at in (1.0, 2.0)]
    lengths = iter(["1", "30", "30"])
    run.loads.part = lambda name, *_args: chaos.Part(name, ["sleep", next(lengths)], run.ctx.env, run.ctx.logs)
    drain.load_kills(run, time.monotonic() + 120)
    assert [(f.kind, f.phase) for f in run.faults.records] == [(chaos.LOAD_KILL, "drain")] * 2
    assert "2026-11-22T12..2026-11-22T13" in run.faults.records[0].target
    assert run.faults.skipped == [] and run.injector.requeued == []
    assert run.loads.rcs == {0: 1, -signal.SIGKILL: 2}


def test_a_worker_that_will_not_start_is_retried_then_reported_down(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.local import spark_cluster

    attempts = []

    def refuse(_settings: object, index: int) -> None:
        attempts.append(index)
        raise spark_cluster.SparkClusterError("java.net.BindException: Address already in use (port 39098)")

    monkeypatch.setattr(spark_cluster, "start_worker", refuse)
    run.injector.worker_down = 1
    run.clock.later(0, "start_worker", (1, 1))
    _run_pending(run)  # never raises
    assert attempts == [1, 1, 1, 1]  # the first try and three retries (the patched backoff)
    assert len(run.restarts.failures) == 4 and run.injector.worker_down == 1
    assert run.restarts.parts_down() == ["spark worker 1 (java.net.BindException: Address already in use (port 39098))"]
    faults = chaos_check.summarize_faults([], {chaos.WORKER_KILL: 1})
    verdict, why = chaos_check.run_verdict({"events": True}, faults, run.restarts.parts_down(), 0)
    assert verdict == "SHORT" and "left down: spark worker 1" in why[-1]


def test_a_worker_that_starts_on_a_retry_is_up(run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.local import spark_cluster

    outcomes = iter([spark_cluster.SparkClusterError("BindException"), None])

    def start(_settings: object, _index: int) -> None:
        failure = next(outcomes)
        if failure is not None:
            raise failure

    monkeypatch.setattr(spark_cluster, "start_worker", start)
    run.injector.worker_down = 2
    run.faults.records.append(chaos.FaultRecord(chaos.WORKER_KILL, "spark worker 2", 0.0, 3.0))
    run.clock.later(0, "start_worker", (2, 1))
    _run_pending(run)
    assert run.injector.worker_down is None and run.restarts.parts_down() == []
    assert run.restarts.counts["spark_worker"] == 1
    assert run.faults.records[0].restored_at_s is not None


def test_a_broker_restarts_only_after_its_old_process_exited(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.local import kafka_broker

    events: list[str] = []
    let_it_exit = threading.Event()

    def stop_node(_settings: object, node: int, _sig: int) -> bool:
        let_it_exit.wait(10)  # a controlled shutdown that takes its time
        events.append(f"{node} exited")
        return True

    monkeypatch.setattr(kafka_broker, "stop_node", stop_node)
    monkeypatch.setattr(kafka_broker, "start_node", lambda _s, node: events.append(f"{node} started"))
    record = chaos.FaultRecord(chaos.BROKER_TERM, "broker 2", 0.0, 2.0)
    run.faults.records.append(record)
    run.injector.broker_down = 2
    stopper = threading.Thread(target=run.injector.stop_broker, args=(2, signal.SIGTERM, record))
    run.injector.broker_stops[2] = stopper
    stopper.start()
    starter = threading.Thread(target=run.injector.start_broker, args=(2, 1))
    starter.start()
    starter.join(0.5)
    assert starter.is_alive() and events == []  # still waiting for the old process
    let_it_exit.set()
    starter.join(5)
    assert events == ["2 exited", "2 started"] and run.injector.broker_down is None and record.injected


def test_a_broker_that_was_not_running_is_not_a_fault(run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.local import kafka_broker

    monkeypatch.setattr(kafka_broker, "stop_node", lambda _s, _node, _sig: False)
    record = chaos.FaultRecord(chaos.BROKER_KILL, "broker 1", 0.0, 2.0)
    run.injector.stop_broker(1, signal.SIGKILL, record)
    assert not record.injected and "not running" in record.note
    summary = chaos_check.summarize_faults([vars(record)], {chaos.BROKER_KILL: 1})
    assert (summary[chaos.BROKER_KILL]["planned"], summary[chaos.BROKER_KILL]["injected"]) == (1, 0)


def test_the_verdict_is_short_when_a_planned_fault_was_not_injected() -> None:
    faults = chaos_check.summarize_faults(
        [{"kind": chaos.LOAD_KILL, "recovery_s": 40.0}], {chaos.LOAD_KILL: 5, chaos.STREAM_KILL: 1}
    )
    assert (faults[chaos.LOAD_KILL]["planned"], faults[chaos.LOAD_KILL]["injected"]) == (5, 1)
    assert faults[chaos.STREAM_KILL]["injected"] == 0
    verdict, why = chaos_check.run_verdict({"events": True, "spend": True}, faults, [], 0)
    assert verdict == "SHORT"
    assert why == ["load_kill: injected 1 of 5 planned", "stream_kill: injected 0 of 1 planned"]
    complete = chaos_check.summarize_faults([{"kind": chaos.LOAD_KILL, "recovery_s": 1.0}], {chaos.LOAD_KILL: 1})
    assert chaos_check.run_verdict({"events": True}, complete, [], 0) == ("PASS", [])
    assert chaos_check.run_verdict({"events": True}, complete, [], 2)[0] == "SHORT"  # stalls
    assert chaos_check.run_verdict({"events": False, "spend": True}, complete, [], 0) == (
        "FAIL",
        ["events check failed"],
    )


def _pause_run(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...] = ("sleep", "60")
) -> chaos.FaultRecord:
    """A stream_pause of a sleeping "driver" (or ``argv``) with a 1 s transaction timeout."""
    monkeypatch.setattr(zombie, "PAUSE_MARGIN_S", 0.0)
    monkeypatch.setattr(zombie, "ZOMBIE_EXIT_S", 0.3)
    run.ctx.settings = load_settings({**run.ctx.env, "ADPIPE_TRANSACTION_TIMEOUT_MS": "1000"})
    run.crew.stream = stream = chaos.Part("stream", list(argv), dict(run.ctx.env), run.ctx.logs)
    stream.start()
    planned = chaos.PlannedFault(1.0, chaos.STREAM_PAUSE, 0.0, 0.2)
    # A driver still starting (its sink has not fenced its predecessors) is
    # no zombie yet: the pause waits.
    assert run.injector.inject(planned) is None and run.crew.pause is None and _state(stream, "S") == "S"
    with stream.log_path.open("a") as log:
        log.write("INFO adpipe.stream.sink: transactional producer ready (older instances fenced)\n")
    record = run.injector.inject(planned)
    assert record is not None and run.crew.pause is not None
    return record


def _state(part: chaos.Part, wait_for: str = "T") -> str:
    """The process's state letter (T: stopped), once it is ``wait_for`` or after 2 s."""
    deadline = time.monotonic() + 2
    while True:
        state = Path(f"/proc/{part.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # type: ignore[union-attr]
        if state == wait_for or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def test_a_stream_pause_outlives_the_transaction_timeout_with_a_successor_running(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = _pause_run(run, monkeypatch)
    stopped, successor = run.crew.pause.zombie, run.crew.pause.successor  # type: ignore[union-attr]
    assert record.down_s == 1.0  # the transaction timeout, not the drawn 0.2 s
    assert _state(stopped) == "T" and successor.alive  # stopped, and a second driver runs
    # The successor is a driver of the same job: the same checkpoint, the same leadership group.
    assert successor.env == stopped.env and successor.argv[-1] == "--standby"
    time.sleep(0.5)
    run.injector.due()
    assert _state(stopped) == "T"  # not resumed before the timeout has passed
    run.monitor.stream_committed += 1  # the successor committed a batch
    _run_pending(run)
    # Resumed; it did not stop by itself (a sleep is never fenced): killed.
    assert run.crew.pause is None and run.crew.stream is successor and not stopped.alive
    assert record.injected and record.restored_at_s is not None and "killed" in record.note


@pytest.mark.parametrize(("argv", "note"), [
    (("sleep", "60"), "idle (its log quiet, no batch to write)"),
    (("sh", "-c", "while :; do echo working; sleep 0.1; done"), "still ran"),
])
def test_a_resumed_zombie_with_a_quiet_log_is_idle_and_one_still_working_is_waited_for(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], note: str
) -> None:
    record = _pause_run(run, monkeypatch, argv)
    monkeypatch.setattr(zombie, "ZOMBIE_QUIET_S", 0.5)
    monkeypatch.setattr(zombie, "ZOMBIE_EXIT_S", 2.5)
    stopped = run.crew.pause.zombie  # type: ignore[union-attr]
    # Another writer's append leaves the driver's offset behind the log's end:
    # its writes then overwrite and the size stands still; it is not quiet.
    with stopped.log_path.open("a") as log:
        log.write("x" * 10_000 + "\n")
    run.monitor.stream_committed += 1  # the successor committed a batch
    time.sleep(1.0)  # past the transaction timeout
    started = time.monotonic()
    _run_pending(run)
    waited = time.monotonic() - started
    assert run.crew.pause is None and not stopped.alive and note in record.note
    # Quiet: killed about ZOMBIE_QUIET_S after its resume; working: at ZOMBIE_EXIT_S.
    assert (waited < 2.0) if "idle" in note else (waited >= 2.5)


def test_a_stream_pause_whose_successor_never_took_over_is_not_counted(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zombie, "PAUSE_MAX_S", 1.5)
    # A successor that never takes over (a real driver would, with a broker
    # answering on this host's default port).
    run.crew.stream_argv = ["sleep", "60"]
    record = _pause_run(run, monkeypatch)
    _run_pending(run)
    assert not record.injected and "no real zombie" in record.note
    assert chaos_check.summarize_faults([vars(record)], {chaos.STREAM_PAUSE: 1})[chaos.STREAM_PAUSE]["injected"] == 0


FENCED = "INFO adpipe.stream.sink: transactional producer ready (older instances fenced)\n"


@pytest.fixture
def standby_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[chaos.ChaosRun]:
    """A run with ADPIPE_STREAM_STANDBY=on whose drivers are sleeps: the
    active one ``sleep 60``, a standby ``sleep 61``. A sleep never warms
    up: a stream fault does not wait for a warm standby here."""
    monkeypatch.setenv("ADPIPE_STREAM_STANDBY", "on")
    monkeypatch.setattr(inject, "STANDBY_WAIT_S", 0.0)
    chaos_run = chaos.ChaosRun(load_settings({"ADPIPE_HOME": str(tmp_path)}), chaos.ChaosSpec(events=10))
    chaos_run.clock.t0 = time.monotonic()
    crew = chaos_run.crew
    crew.stream_argv, crew.standby_argv = ["sleep", "60"], ["sleep", "61"]
    crew.budgets = []
    yield chaos_run
    crew.kill(chaos_run.loads.load)


def _start_drivers(run: chaos.ChaosRun) -> tuple[chaos.Part, chaos.Part]:
    crew = run.crew
    assert crew.with_standby and crew.standby is not None
    run.supervisor.supervise()  # starts the job's driver
    active, standby = crew.stream, crew.standby
    assert active.alive and not standby.alive  # a standby only beside a driver that committed a batch
    _progress(run)
    run.supervisor.supervise()
    run.restarts.counts.clear()  # the run's first starts are no restarts
    assert active.alive and standby.alive and active.argv == ["sleep", "60"] and standby.argv == ["sleep", "61"]
    with active.log_path.open("a") as log:
        log.write(FENCED)
    return active, standby


def _progress(run: chaos.ChaosRun) -> None:
    """The stream job's ledger moved (as the monitor samples it)."""
    time.sleep(0.01)
    run.monitor.stream_progress_at = time.monotonic()


def _supervise_until(run: chaos.ChaosRun, done, timeout_s: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        run.supervisor.supervise()
        run.injector.due()
        time.sleep(0.05)
    assert done()


def test_with_a_standby_a_killed_driver_hands_the_job_over_and_comes_back_as_the_standby(
    standby_run: chaos.ChaosRun,
) -> None:
    run, crew = standby_run, standby_run.crew
    active, standby = _start_drivers(run)
    # A driver that has not taken its transactional id yet is not hit: with a
    # standby, the fault is for the active driver.
    with active.log_path.open("w") as log:
        log.write("starting\n")
    planned = chaos.PlannedFault(1.0, chaos.STREAM_KILL, 0.0, 3.0)
    assert run.injector.inject(planned) is None and active.alive
    with active.log_path.open("a") as log:
        log.write(FENCED)
    record = run.injector.inject(planned)
    assert record is not None and record.target == f"stream pid {active.proc.pid}"  # type: ignore[union-attr]
    # The standby is a sleep, not in the kernel's lock table: not warm yet.
    assert record.note == "standby warming"
    active.proc.wait(timeout=5)  # type: ignore[union-attr]
    run.supervisor.supervise()
    # At once: the standby is the job's driver, the fault restored then.
    assert crew.stream is standby and crew.standby is active and record.restored_at_s is not None
    assert run.restarts.counts["stream_takeover"] == 1 and run.restarts.counts["stream"] == 0
    assert not active.alive
    # Restarted as the standby once the job's new driver has committed a batch, not before.
    time.sleep(1.2)
    run.supervisor.supervise()
    assert not active.alive
    _progress(run)
    _supervise_until(run, lambda: active.alive)
    assert active.argv == ["sleep", "61"] and active.starts == 2 and run.restarts.counts["standby"] == 1
    assert standby.alive and standby.starts == 1


def test_with_astandby_a_stream_fault_waits_for_thestandby_to_stand_by(
    standby_run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, crew = standby_run, standby_run.crew
    active, standby = _start_drivers(run)
    monkeypatch.setattr(inject, "STANDBY_WAIT_S", 60.0)
    state = {"now": "warming"}
    monkeypatch.setattr(crew, "standby_state", lambda: state["now"])
    planned = chaos.PlannedFault(1.0, chaos.STREAM_KILL, 0.0, 3.0)
    assert run.injector.inject(planned) is None and active.alive
    state["now"] = "waiting"  # in the lock table, its warm-up still running
    record = run.injector.inject(planned)
    assert record is not None and record.note == "standby waiting"
    active.proc.wait(timeout=5)  # type: ignore[union-attr]
    # A standby that stays cold past the wait does not hold the faults back for good.
    state["now"] = "down"
    crew.standby = active
    crew.stream = standby
    planned = chaos.PlannedFault(2.0, chaos.STREAM_KILL, 0.0, 3.0)
    with standby.log_path.open("a") as log:
        log.write(FENCED)
    assert run.injector.inject(planned) is None and standby.alive
    standby.active_since -= 61.0
    record = run.injector.inject(planned)
    assert record is not None and record.note == "standby down"


def test_with_a_standby_both_drivers_gone_start_as_active_and_standby(standby_run: chaos.ChaosRun) -> None:
    run, crew = standby_run, standby_run.crew
    active, standby = _start_drivers(run)
    for part in (active, standby):
        part.signal(signal.SIGKILL)
        part.proc.wait(timeout=5)  # type: ignore[union-attr]
    run.supervisor.supervise()
    assert crew.stream is active and crew.standby is standby  # no live standby to hand over to
    _supervise_until(run, lambda: active.alive)
    _progress(run)
    _supervise_until(run, lambda: standby.alive)
    assert active.argv == ["sleep", "60"] and standby.argv == ["sleep", "61"]
    assert run.restarts.counts == {"stream": 1, "standby": 1}


def test_with_a_standby_a_stream_pause_is_taken_over_by_the_standby(
    standby_run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, crew = standby_run, standby_run.crew
    monkeypatch.setattr(zombie, "PAUSE_MARGIN_S", 0.0)
    monkeypatch.setattr(zombie, "ZOMBIE_EXIT_S", 0.3)
    run.ctx.settings = load_settings({**run.ctx.env, "ADPIPE_TRANSACTION_TIMEOUT_MS": "1000"})
    active, standby = _start_drivers(run)
    record = run.injector.inject(chaos.PlannedFault(1.0, chaos.STREAM_PAUSE, 0.0, 0.2))
    assert record is not None and crew.pause is not None
    # No second driver of its own: the standby is the successor.
    assert crew.pause.zombie is active and crew.pause.successor is standby and crew.standby is None
    assert not list(run.ctx.home.glob("checkpoint-view-*")) and _state(active) == "T"
    run.supervisor.supervise()
    assert crew.stream is active and active.starts == standby.starts == 1  # no restart during the pause
    with standby.log_path.open("a") as log:
        log.write(FENCED)  # the standby took over: its sink fenced the paused driver
    _run_pending(run)
    assert crew.pause is None and crew.stream is standby and crew.standby is active and not active.alive
    assert record.injected and record.restored_at_s is not None
    _progress(run)
    _supervise_until(run, lambda: active.alive)
    assert active.argv == ["sleep", "61"] and run.restarts.counts["standby"] == 1


def test_with_a_standby_the_roles_follow_the_leadership_group(
    standby_run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both drivers started as standbys (the active one died while the
    other still warmed up): the one leading the job's group is its driver."""
    import socket

    from adpipe.stream import leadership

    run, crew = standby_run, standby_run.crew
    active, standby = _start_drivers(run)
    group: list[leadership.Driver] = []
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0, describe=None: list(group))

    def lead(part: chaos.Part) -> None:  # the brokers' answer: this part leads, the other waits
        other = standby if part is active else active
        group[:] = [leadership.Driver(socket.gethostname(), part.proc.pid, True),  # type: ignore[union-attr]
                    leadership.Driver(socket.gethostname(), other.proc.pid, False)]  # type: ignore[union-attr]

    lead(active)
    run.supervisor.supervise()
    assert crew.stream is active and crew.standby is standby
    lead(standby)
    run.supervisor.supervise()
    assert crew.stream is standby and crew.standby is active and active.alive and standby.alive
    assert run.restarts.counts == {}  # nothing restarted, nothing taken over by a fault


def test_a_standby_is_warm_once_warmed_up_and_waiting_in_the_leadership_group(
    standby_run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from adpipe.stream import leadership

    crew = standby_run.crew
    group: list[leadership.Driver] = []
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0, describe=None: list(group))
    crew.standby_argv = ["sleep", "60"]
    standby = crew.standby
    assert standby is not None
    crew.prepare_start(standby)
    standby.start()
    assert crew.standby_state() == "warming"  # not in the group yet
    group.append(leadership.Driver(socket.gethostname(), standby.proc.pid, False))  # type: ignore[union-attr]
    assert crew.standby_state() == "waiting"  # waiting, its warm-up not done
    with standby.log_path.open("a") as log:
        log.write(f"INFO adpipe.stream: {leadership.STANDBY_WARM_LINE}12.3 s\n")
    assert crew.standby_state() == "warm"
    standby.signal(signal.SIGKILL)
    standby.proc.wait(timeout=5)  # type: ignore[union-attr]
    assert crew.standby_state() == "down"


def test_with_a_standby_down_a_stream_pause_waits_for_it(standby_run: chaos.ChaosRun) -> None:
    run, crew = standby_run, standby_run.crew
    active, standby = _start_drivers(run)
    standby.signal(signal.SIGKILL)
    standby.proc.wait(timeout=5)  # type: ignore[union-attr]
    planned = chaos.PlannedFault(1.0, chaos.STREAM_PAUSE, 0.0, 0.2)
    assert run.injector.inject(planned) is None and crew.pause is None and _state(active, "S") == "S"
    assert not list(run.ctx.home.glob("checkpoint-view-*"))  # no driver of its own started


def test_a_fault_waiting_for_its_target_stays_planned_while_others_are_injected(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run extends until its planned faults ran: a stream fault waiting for
    the standby (here: never ready) is dropped only once no fault at all
    could be injected for FAULT_WAIT_S, not FAULT_WAIT_S after its planned
    time while budget faults go on being injected."""
    from adpipe.tools.chaos import harness

    monkeypatch.setattr(harness, "FAULT_WAIT_S", 5.0)
    now = [0.0]
    run.clock.t0 = time.monotonic()
    monkeypatch.setattr(run.clock, "elapsed", lambda: now[0])
    injected: list[float] = []

    def inject(planned: chaos.PlannedFault) -> object | None:
        if planned.kind != chaos.BUDGET_KILL:
            return None
        injected.append(now[0])
        return planned

    monkeypatch.setattr(run.injector, "inject", inject)
    waiting = chaos.PlannedFault(0.0, chaos.STREAM_KILL, 0.0, 1.0)
    queue = [waiting, *(chaos.PlannedFault(float(at), chaos.BUDGET_KILL, 0.0, 1.0) for at in (1, 3, 5, 7, 9))]
    producer = threading.Thread(target=lambda: None)
    producer.start()
    producer.join()
    for second in range(14):
        now[0] = float(second)
        run._inject_due(queue, producer)  # noqa: SLF001 - the window's step, alone
    assert injected == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert queue == [waiting] and run.faults.skipped == []  # 13 s after its plan, 4 s after the last injected
    now[0] = 15.0
    run._inject_due(queue, producer)  # noqa: SLF001
    assert queue == [] and [s["kind"] for s in run.faults.skipped] == [chaos.STREAM_KILL]
    assert "nor any other's" in run.faults.skipped[0]["why"]


class _Hosts:
    """The run's hosts as a host fault sees them: three usable, what it cut or killed."""

    def __init__(self) -> None:
        self.killed: list[str] = []

    def usable(self) -> list[str]:
        return ["host-1", "host-2", "host-3"]

    def kill(self, name: str) -> None:
        self.killed.append(name)


def test_a_host_fault_on_the_active_driver_s_host_waits_for_the_standby_then_follows_the_driver(
    standby_run: chaos.ChaosRun,
) -> None:
    from adpipe.tools.chaos.hostfaults import HostFaults

    run = standby_run
    active, standby = _start_drivers(run)
    active.host, standby.host = "host-1", "host-2"
    spread = _Hosts()
    faults = HostFaults(run.ctx, run.crew, run.loads, run.restarts, run.faults, run.clock, spread)  # type: ignore[arg-type]
    planned = chaos.PlannedFault(1.0, chaos.HOST_KILL, 0.1, 3.0)  # picks host-1 of three: the active driver's

    def record() -> chaos.FaultRecord:
        return chaos.FaultRecord(chaos.HOST_KILL, "", 0.0, 3.0)

    # Its standby not standing by yet: the fault waits.
    assert not faults.inject(record(), planned, lambda: None) and spread.killed == []
    # Meanwhile a driver fault's takeover moved the active driver to host-3:
    # the fault still takes the active driver's host, not the one it picked.
    active.host = "host-3"
    landed = record()
    assert faults.inject(landed, planned, lambda: "warm")
    assert spread.killed == ["host-3"] and landed.failover and landed.note == "on it: stream-a (active)"
    assert faults.host_down == "host-3" and faults.at_active == set()

