"""The chaos run's loads as load-DAG runs (adpipe.tools.chaos.airflow), without
Airflow: the triggers and the runs' states stood in for, the rest real."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from adpipe.tools import chaos
from adpipe.tools.chaos import airflow, check, parts


class _Host:
    def __init__(self, name: str) -> None:
        self.name = name
        self.started: list[list[str]] = []

    def env(self, base: dict[str, str]) -> dict[str, str]:
        return dict(base)

    def start(self, argv: list[str], log_path: Path, env: dict[str, str]):  # noqa: ANN201
        self.started.append(argv)

        class _Started:
            popen = parts.start_detached(["sleep", "30"], log_path, env=env, append=False)
            ns_pid = 1

        return _Started()


class _Spread:
    """Three hosts, of which ``down`` are not usable."""

    def __init__(self) -> None:
        self.net = {name: _Host(name) for name in ("host-1", "host-2", "host-3", "services")}
        self.down: set[str] = set()

    def usable(self) -> list[str]:
        return [name for name in ("host-1", "host-2", "host-3") if name not in self.down]

    def host_for(self, preferred: str | None, avoid: list[str]):  # noqa: ANN201 - placement is place()'s (tested there)
        return self.net[self.usable()[0]]


class _Airflow:
    """What a load's DAG runs ask of the run's Airflow: the runs' states."""

    def __init__(self, ctx: chaos.RunContext) -> None:
        self.ctx = ctx
        self.run_states: dict[str, str] = {}
        self.services_env = dict(ctx.env)

    def states(self, run_ids: list[str]) -> dict[str, str]:
        return {r: s for r, s in self.run_states.items() if r in run_ids}


@pytest.fixture
def run(chaos_run: chaos.ChaosRun) -> chaos.ChaosRun:
    return chaos_run


def _wait(what, timeout_s: float = 10.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError("not within the time")


def test_a_load_s_dag_runs_are_triggered_in_turn_and_it_ends_when_every_run_ended(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(airflow, "STATE_POLL_S", 0.0)
    fake = _Airflow(run.ctx)
    # The trigger command: a script that notes its arguments.
    noted = run.ctx.home / "triggered"
    script = run.ctx.home / "trigger.py"
    script.write_text(f"import sys\nopen({str(noted)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n")
    monkeypatch.setattr(airflow, "AIRFLOW", str(script))
    monkeypatch.setattr(airflow.subprocess, "Popen", _with_python(airflow.subprocess.Popen))
    load = airflow.DagRunLoad(fake, "final-load1", ["2026-11-22T12", "2026-11-22T13"])  # type: ignore[arg-type]
    assert load.start() and load.alive
    # Triggered one after the other, each with its hour, and running until each run ended.
    def triggered(count: int) -> bool | None:
        load.proc.poll() if load.proc is not None else None  # the next trigger starts when the last one ended
        return True if noted.is_file() and len(noted.read_text().splitlines()) == count else None

    _wait(lambda: triggered(2))
    lines = noted.read_text().splitlines()
    assert [line.split("--run-id ")[1].split()[0] for line in lines] == load.run_ids
    assert '{"hour": "2026-11-22T12"}' in lines[0] and '{"hour": "2026-11-22T13"}' in lines[1]
    fake.run_states = {load.run_ids[0]: "success", load.run_ids[1]: "running"}
    assert load.proc.poll() is None and load.alive  # type: ignore[union-attr]
    fake.run_states[load.run_ids[1]] = "failed"
    assert load.proc.wait(timeout=5) == 1  # type: ignore[union-attr]
    load.reap()
    assert load.exits == {1: 1} and load.proc is None and not load.alive
    # Every run succeeded: 0.
    again = airflow.DagRunLoad(fake, "load2-x", ["2026-11-22T12"])  # type: ignore[arg-type]
    again.start()
    load = again
    _wait(lambda: triggered(3))
    fake.run_states[again.run_ids[0]] = "success"
    assert again.proc.wait(timeout=5) == 0  # type: ignore[union-attr]


def _with_python(popen):  # noqa: ANN001, ANN202
    """Popen that runs a ``.py`` command with this interpreter."""

    def start(argv, **kwargs):  # noqa: ANN001, ANN202
        return popen([sys.executable, *argv] if str(argv[0]).endswith(".py") else argv, **kwargs)

    return start


def test_a_load_whose_trigger_failed_ends_with_the_trigger_s_exit_code(
    run: chaos.ChaosRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(airflow, "AIRFLOW", "false")
    load = airflow.DagRunLoad(_Airflow(run.ctx), "load1-x", ["2026-11-22T12"])  # type: ignore[arg-type]
    load.start()
    assert load.proc.wait(timeout=5) == 1  # type: ignore[union-attr]


class _Load:
    """A load that runs, with a task to kill only from its ``ready``-th ask on."""

    def __init__(self, ready: int) -> None:
        self.asked, self.ready, self.killed = 0, ready, False
        self.started_at = time.monotonic()
        self.proc = None

    @property
    def alive(self) -> bool:
        return not self.killed

    def signal(self, sig: int) -> bool:
        self.asked += 1
        self.killed = self.asked >= self.ready and sig == signal.SIGKILL
        return self.killed

    def reap(self) -> None:
        pass


def test_a_load_kill_on_a_dag_run_between_tasks_lands_when_its_next_task_runs(run: chaos.ChaosRun) -> None:
    load = _Load(ready=3)
    run.loads.load = load  # type: ignore[assignment]
    planned = chaos.PlannedFault(1.0, chaos.LOAD_KILL, 0.0, 3.0)
    record = chaos.FaultRecord(chaos.LOAD_KILL, "load x", 0.0, 3.0)
    run.injector.land_load_kill(load, record, planned)  # type: ignore[arg-type]
    # Nothing to kill yet: asked again (not requeued, not dropped) until it lands.
    assert run.faults.records == [] and run.injector.requeued == [] and run.clock.pending
    run.clock.pending = [(0.0, action, arg) for _, action, arg in run.clock.pending]
    for _ in range(5):
        run.injector.due()
        run.clock.pending = [(0.0, action, arg) for _, action, arg in run.clock.pending]
    assert load.killed and load.asked == 3 and [f.kind for f in run.faults.records] == [chaos.LOAD_KILL]
    assert run.faults.skipped == [] and run.injector.requeued == []


def test_a_pinned_part_starts_on_its_own_host_only(run: chaos.ChaosRun) -> None:
    spread = _Spread()
    worker = parts.Part("airflow-worker-host-2", ["sleep", "30"], run.ctx.env, run.ctx.logs, spread, "host-2",  # type: ignore[arg-type]
                        pinned=True)
    spread.down = {"host-2"}
    assert not worker.start() and worker.proc is None
    spread.down = set()
    try:
        assert worker.start() and worker.host == "host-2" and spread.net["host-2"].started == [["sleep", "30"]]
    finally:
        worker.signal(signal.SIGKILL)
        worker.proc.wait(timeout=5)  # type: ignore[union-attr]
    # Unpinned, a part goes to another usable host.
    other = parts.Part("budget-1", ["sleep", "30"], run.ctx.env, run.ctx.logs, spread, "host-2")  # type: ignore[arg-type]
    spread.down = {"host-2"}
    try:
        assert other.start() and other.host == "host-1"
    finally:
        other.signal(signal.SIGKILL)
        other.proc.wait(timeout=5)  # type: ignore[union-attr]


def test_the_run_s_own_loads_name_their_hours_as_adpipe_load_does(run: chaos.ChaosRun) -> None:
    assert run.loads.part("load1", ["2026-11-22T12"]).argv[-2:] == ["--hour", "2026-11-22T12"]  # type: ignore[union-attr]
    span = run.loads.part("final-load1", ["2026-11-22T12", "2026-11-22T13", "2026-11-22T14"])
    assert span.argv[-4:] == ["--hour", "2026-11-22T12", "--to-hour", "2026-11-22T14"]  # type: ignore[union-attr]


def test_the_table_says_how_many_load_runs_ended_how_and_where_their_tasks_ran() -> None:
    line = check.summary.airflow_line({
        "load_runs": {"success": 40, "failed": 2},
        "task_tries_by_host": {"host-1": {"success": 30, "failed": 2}, "host-2": {"success": 25}},
    })
    assert line == ("airflow: load DAG runs 2 failed, 40 success; task tries by worker host: "
                    "host-1 32 (30 succeeded); host-2 25 (25 succeeded)")
