"""One chaos run from start to end (:class:`ChaosRun`): set-up, the warm-up,
the fault window, the drain and the report; and ``adpipe chaos`` itself."""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import datetime

from adpipe import kafka_io, pg
from adpipe.settings import Settings
from adpipe.tools import hosts, produce

from . import check, drain, report, spread
from .airflow import AirflowError
from .plan import LOAD_KILL, ChaosSpec, PlannedFault, event_plans, fault_schedule, run_hours
from .rig import Rig

log = logging.getLogger("adpipe.tools.chaos")

# The fault clock waits this long at most for the stream job's first batch.
WARM_UP_MAX_S = 300.0
# How long a planned fault may wait for its target (a paused driver, a
# broker catching up, an hour to load) while no other fault could be
# injected either, before it is dropped: while faults go on being injected
# the run extends until every planned one ran (a driver fault waits for the
# standby to warm again, about 70 s, and those of a long run queue up).
FAULT_WAIT_S = 600.0


class ChaosRun(Rig):
    """One run: set-up, the fault window, the drain and the check."""

    def run(self) -> dict:
        spec, ctx = self.spec, self.ctx
        kinds = self.injector.kinds()
        schedule = fault_schedule(self.seed, spec, kinds)
        print(
            f"chaos run {ctx.run_id}, seed {self.seed} (replay: --seed {self.seed}); {len(schedule)} faults "
            f"planned over {spec.duration_s:.0f} s of kinds {', '.join(kinds)}; {spec.events} events at "
            f"{spec.events_per_second:.0f}/s on {ctx.settings.kafka_bootstrap}, Spark {ctx.settings.spark_master}"
            f"{', a warm standby driver' if self.crew.with_standby else ''}"
            f"{f'; parts spread over {spec.hosts} hosts' if spec.hosts else ''}; logs in {ctx.logs}",
            flush=True,
        )
        pg.ensure_databases(ctx.base, ctx.databases())
        kafka_io.ensure_pipeline_topics(ctx.settings)
        if self.airflow is not None:
            print(
                "Airflow: Redis, the API server, scheduler, DAG processor and triggerer on the services host, "
                "a Celery worker on each host; the loads are runs of the load DAG",
                flush=True,
            )
            self.airflow.up()
        main, closer, closer_start = event_plans(spec, self.seed, ctx.settings.lateness_ms)
        produce.write_summary(main.summary, ctx.home / "produced.json")
        self.loads.hours = run_hours(main)
        self.monitor.hours = self.loads.hours

        self.clock.t0 = time.monotonic()
        try:
            return self._run(schedule, main, closer, closer_start)
        finally:
            # Whatever happened (an error here, Ctrl-C): no part outlives the run.
            self.crew.kill(self.loads.load)
            self.monitor.stop.set()
            if self.airflow is not None:
                self.airflow.close()
            if self.spread is not None:
                self.spread.down()

    def _run(
        self, schedule: list[PlannedFault], main: produce.Plan, closer: produce.Plan, closer_start: datetime
    ) -> dict:
        # The standby follows once the job's driver has committed a batch (Supervisor.standby_due).
        for part in [self.crew.stream, *self.crew.budgets]:
            part.start()
        producer = threading.Thread(target=self._produce, args=(main,), daemon=True)
        producer.start()
        watcher = threading.Thread(target=self.monitor.loop, daemon=True)
        watcher.start()
        self._warm_up()
        self._window(schedule, producer)

        print("fault window over: draining (every part up, closing events, every hour loaded)", flush=True)
        drain_started = time.monotonic()
        produce.send(self.ctx.settings.kafka, self.ctx.settings.topics.events, closer)
        closer_minute = closer_start.strftime("%Y-%m-%dT%H:%M:00Z")
        drain.run(self, drain_started)
        drain_s = time.monotonic() - drain_started
        for part in [*self.crew.drivers(), *self.crew.budgets]:
            part.stop()
        return report.write(self, main, closer_minute, drain_s, schedule)

    def _produce(self, main: produce.Plan) -> None:
        settings = self.ctx.settings
        try:
            produce.send(settings.kafka, settings.topics.events, main, self.spec.events_per_second)
        except Exception as exc:  # noqa: BLE001 - reported, and the check will say what is missing
            self.producer_error = str(exc)
            log.error("the producer failed: %s", exc)

    def _warm_up(self) -> None:
        """The fault clock starts once the stream job has committed a batch:
        faults are meant for a running pipeline, not only its start-up."""
        warm_up = time.monotonic()
        while self.monitor.stream_committed == 0 and time.monotonic() - warm_up < WARM_UP_MAX_S:
            self.supervisor.supervise()
            time.sleep(0.5)
        self.warm_up_s = time.monotonic() - warm_up
        self.clock.t0 = time.monotonic()
        print(f"  warm-up: the stream job committed its first batch after {self.warm_up_s:.0f} s; faults begin")

    def _window(self, schedule: list[PlannedFault], producer: threading.Thread) -> None:
        """The fault window: the schedule's faults, a load every
        ``load_interval_s``, until the window is over, the producer done,
        every fault tried and every action due carried out."""
        spec, clock = self.spec, self.clock
        next_load = time.monotonic() + spec.load_interval_s
        queue = list(schedule)
        last_note = retry_at = 0.0
        while queue or clock.elapsed() < spec.duration_s or producer.is_alive() or clock.pending:
            if self.injector.requeued:  # load kills whose load finished first: again, on the next load
                queue = sorted([*queue, *self.injector.requeued], key=lambda f: f.at_s)
                self.injector.requeued.clear()
            if queue and clock.elapsed() >= max(queue[0].at_s, retry_at):
                self._inject_due(queue, producer)
                retry_at = clock.elapsed() + 3
            self.tick()
            if time.monotonic() >= next_load:
                self.loads.start_next()
                next_load = time.monotonic() + spec.load_interval_s
            if clock.elapsed() - last_note >= 30:
                last_note = clock.elapsed()
                print(
                    f"  {last_note:5.0f} s: {len(self.faults.records)} faults, stream lag {self.monitor.stream_lag}, "
                    f"restarts {self.restart_counts()}",
                    flush=True,
                )
            time.sleep(0.25)

    def _inject_due(self, queue: list[PlannedFault], producer: threading.Thread) -> None:
        """The due faults in order; one that cannot happen yet (a broker still
        catching up, the driver paused, no hour to load) waits, tried again
        every few seconds, without holding back the faults after it; past
        FAULT_WAIT_S after its planned time and the last fault injected, it
        is dropped (and the run is short of its target). A load kill that
        found no closed hour is carried over to the drain."""
        elapsed = self.clock.elapsed
        for planned in [f for f in queue if f.at_s <= elapsed()]:
            if self.injector.inject(planned) is not None:
                queue.remove(planned)
                self.last_injected_s = elapsed()
                break  # one per turn: the next finds its target's state after this one
            waited_since = max(planned.at_s, self.last_injected_s)
            window_over = elapsed() >= self.spec.duration_s and not producer.is_alive()
            if (
                planned.kind == LOAD_KILL
                and not self.monitor.closed_hours
                and (window_over or elapsed() > waited_since + FAULT_WAIT_S)
            ):
                queue.remove(planned)
                self.faults.carried.append(planned)
            elif elapsed() > waited_since + FAULT_WAIT_S:
                queue.remove(planned)
                self.faults.skip(planned, f"its target was not there for {FAULT_WAIT_S:.0f} s, nor any other's")


def run(settings: Settings, spec: ChaosSpec) -> int:
    """``adpipe chaos``: one run; prints the table and keeps the JSON."""
    if spec.hosts:
        reason = hosts.unavailable_reason()
        if reason is not None:
            raise SystemExit(f"adpipe chaos --hosts {spec.hosts}: {reason}")
    try:
        chaos = ChaosRun(settings, spec)
    except (spread.SpreadError, hosts.HostsError) as exc:
        raise SystemExit(f"adpipe chaos --hosts {spec.hosts}: {exc}") from exc

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(f"adpipe chaos: stopped by signal {signum}; every part of the run was killed")

    # SIGTERM as Ctrl-C: the run's finally kills what it started.
    signal.signal(signal.SIGTERM, stop)
    # The monitor asks every few seconds whether an hour closed: "not yet"
    # is no news here.
    logging.getLogger("adpipe.lakehouse.ranges").setLevel(logging.WARNING)
    try:
        result = chaos.run()
    except AirflowError as exc:
        raise SystemExit(f"adpipe chaos --hosts {spec.hosts}: {exc}") from exc
    print(check.render_table(result))
    print(f"report: {chaos.ctx.home / 'report.json'}")
    return 0 if result["ok"] else 1
