"""``python -m bench --failover --hosts N`` (``make bench ARGS="--failover
--hosts 2"``): how long the stream job is blind when the active driver's
whole host fails, with a warm standby on another host.

One run, on hosts made on this machine (:mod:`adpipe.tools.hosts`; needs
root): N hosts and a services host with three brokers that the others reach
over the network only; fresh topics and job id there, the checkpoint on the
file system the hosts share. An active driver on one host, a warm standby
(``adpipe stream --standby``) on the next, each in Spark's local mode, and
a producer (in this process, which reaches the services host alone)
sending at ``rate`` events/s for the whole run. Then ``faults`` times, the
kinds in turn:

* ``cut``: the active driver's host cut off from everything (its cable
  pulled), healed once the driver has ended itself;
* ``cut_brokers``: cut off from the services host only (it still reaches
  the other hosts), healed likewise;
* ``kill``: every process of the host killed (its PID namespace ended),
  the host started again, empty.

Each is timed from the fault to the standby's first batch done (its log's
``standby: took over`` line), split into the wait for the leadership (the
group coordinator ends the lost driver's session) and the first batch. A
cut-off driver must end itself (exit 4, fenced) while still cut off, and
must never commit a batch the standby commits: its batch lines after the
fault are counted, and one at or past the standby's first batch fails the
run. The standby leads the next round, a new standby starts on the next
host (the faulted one, back). At the end the producer stops, the last
driver drains and stops, and ``adpipe verify`` must pass. Prints p50, p99
and the worst per kind and over all; keeps them as JSON under
``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from adpipe import kafka_io
from adpipe.local import kafka_broker
from adpipe.settings import Settings, load_settings
from adpipe.stream import leadership
from adpipe.tools import demo, hosts
from adpipe.tools.chaos.spread import Spread, hosts_base

from bench.failover import WARM, percentiles, produce_steadily

KINDS = ("cut", "cut_brokers", "kill")
# What each kind cuts (adpipe.tools.hosts.Hosts.cut_off); kill cuts nothing.
CUTS = {"cut": "everything", "cut_brokers": "services"}
START_TIMEOUT_S = 300.0
TAKEOVER_TIMEOUT_S = 600.0
TOOK_OVER_LINE = re.compile(r"standby: took over \((?P<reason>.*)\); batch (?P<batch>\d+) done (?P<s>[\d.]+) s")
BATCH_LINE = re.compile(r"adpipe\.stream: batch (\d+):")


@dataclass
class Fault:
    """One fault: its kind and host, and what followed it."""

    kind: str
    host: str
    seconds: float | None = None  # the fault to the standby's first batch done
    first_batch_s: float | None = None  # of which the standby's first batch, from its takeover
    standby_batch: int | None = None
    zombie_exit: int | None = None  # a cut-off driver's exit code (None: killed with its host)
    zombie_batches: list[int] = field(default_factory=list)  # its batch lines after the fault

    @property
    def double_commit(self) -> bool:
        """The faulted driver logged a batch the standby committed (or a later one)."""
        return self.standby_batch is not None and any(b >= self.standby_batch for b in self.zombie_batches)

    def row(self) -> dict:
        return {"kind": self.kind, "host": self.host, "seconds": _round(self.seconds),
                "leadership_s": _round(None if self.seconds is None or self.first_batch_s is None
                                       else self.seconds - self.first_batch_s),
                "first_batch_s": _round(self.first_batch_s), "standby_batch": self.standby_batch,
                "zombie_exit": self.zombie_exit, "zombie_batches_after_fault": self.zombie_batches}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def batches(text: str) -> list[int]:
    """The batch ids a driver's log says it committed (or skipped), in order."""
    return [int(b) for b in BATCH_LINE.findall(text)]


def took_over(text: str) -> re.Match | None:
    """A standby's ``took over`` line: its reason, first batch and seconds."""
    return TOOK_OVER_LINE.search(text)


def summarize(faults: list[Fault]) -> dict:
    """Percentiles over every fault timed and per kind, and the findings:
    cut-off drivers that did not exit fenced, double commits."""
    timed = [f for f in faults if f.seconds is not None]
    by_kind = {kind: percentiles([f.seconds for f in timed if f.kind == kind])
               for kind in dict.fromkeys(f.kind for f in faults)}
    cut = [f for f in faults if f.kind in CUTS]
    return {
        **percentiles([f.seconds for f in timed]),
        "by_kind": by_kind,
        "leadership_p50_s": _median([f.seconds - f.first_batch_s for f in timed if f.first_batch_s is not None]),
        "first_batch_p50_s": _median([f.first_batch_s for f in timed if f.first_batch_s is not None]),
        "zombies_fenced": sum(1 for f in cut if f.zombie_exit == leadership.EXIT_FENCED),
        "zombies": len(cut),
        "double_commits": sum(1 for f in faults if f.double_commit),
        "untimed": len(faults) - len(timed),
    }


def _median(values: list[float]) -> float | None:
    return percentiles(values)["p50_s"]


class Drivers:
    """The run's drivers on its hosts."""

    def __init__(self, spread: Spread, env: dict[str, str], work: Path) -> None:
        self.spread = spread
        self.env = env
        self.work = work
        self.started: list[hosts.HostProcess] = []

    def start(self, host: str, n: int, *args: str) -> hosts.HostProcess:
        on = self.spread.net[host]
        proc = on.start([sys.executable, "-m", "adpipe", "stream", *args], self.work / f"driver-{n}-{host}.log",
                        on.env(self.env))
        self.started.append(proc)
        return proc

    def stop_all(self, timeout_s: float = 120.0) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.signal(signal.SIGCONT)
                proc.signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:  # a driver that does not stop is killed
                proc.kill()


def _wait(what: str, probe, timeout_s: float, proc: hosts.HostProcess | None = None) -> None:  # noqa: ANN001
    """Until ``probe()`` holds (asked every 0.1 s), or a RuntimeError naming
    ``what`` (with the log of ``proc``, when it ended first)."""
    deadline = time.monotonic() + timeout_s
    while not probe():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"host failover bench: {what}: the driver on {proc.host} exited {proc.returncode}\n"
                               f"{proc.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"host failover bench: timed out ({timeout_s:.0f} s) waiting for {what}")
        time.sleep(0.1)


def _leader_on(job: Settings, host: str) -> bool:
    try:
        current = leadership.leader(job, timeout_s=5)
    except Exception:  # noqa: BLE001 - the group not described this time: asked again
        return False
    return current is not None and current.host == host


def run(settings: Settings, faults: int = 9, rate: float = 5.0, host_count: int = 2,
        kinds: tuple[str, ...] = KINDS, seed: int = 7) -> dict:
    """The measurement (module doc); its summary."""
    reason = hosts.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"python -m bench --failover --hosts: hosts cannot be made here: {reason}")
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise SystemExit(f"--host-faults: one or more of {', '.join(KINDS)} (got {', '.join(kinds) or 'none'})")
    run_id = f"host-failover-{time.strftime('%Y%m%d%H%M%S')}"
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    spread = Spread(hosts_base(work), host_count)
    print(f"making {host_count} hosts and a services host (three brokers) under {spread.net.base}", flush=True)
    reach = spread.up(dict(os.environ))
    rng = random.Random(seed)
    stop = threading.Event()
    record: list[Fault] = []
    drivers: Drivers | None = None
    verify_ok: bool | None = None
    try:
        services = load_settings({**os.environ, **reach, "ADPIPE_HOME": str(spread.services_home)})
        env = {
            **demo.demo_env(services, run_id),
            "ADPIPE_HOME": str(work / "client"),
            "ADPIPE_KAFKA_BOOTSTRAP": kafka_broker.cluster_bootstrap(services),
            "ADPIPE_CHECKPOINT_URI": f"file://{work / 'checkpoints'}",  # the file system the hosts share
            "ADPIPE_SPARK_MASTER": "local[2]",
            "ADPIPE_TRIGGER_INTERVAL_S": os.environ.get("ADPIPE_TRIGGER_INTERVAL_S", "1"),
        }
        job = load_settings(env)
        kafka_io.ensure_pipeline_topics(job)
        drivers = Drivers(spread, env, work)
        names = spread.names
        active_host = names[0]
        active = drivers.start(active_host, 0)
        _wait(f"the first driver leading on {active_host}", lambda: _leader_on(job, active_host), START_TIMEOUT_S,
              active)
        producer = threading.Thread(target=produce_steadily, args=(job.kafka, job.topics.events, rate, stop),
                                    daemon=True)
        producer.start()
        for n in range(1, faults + 1):
            kind = kinds[(n - 1) % len(kinds)]
            standby_host = names[(names.index(active_host) + 1) % len(names)]
            standby = drivers.start(standby_host, n, "--standby")
            _wait(f"standby {n} on {standby_host} warm", lambda s=standby: WARM in s.log(), START_TIMEOUT_S, standby)
            time.sleep(rng.uniform(2.0, 6.0))  # a random moment of the active driver's batches
            fault = Fault(kind, active_host)
            record.append(fault)
            logged = len(batches(active.log()))
            fault_at = time.monotonic()
            if kind == "kill":
                spread.kill(active_host)
            else:
                spread.cut_off(active_host, CUTS[kind])
            _wait(f"standby {n} on {standby_host} taking over", lambda s=standby: took_over(s.log()),
                  TAKEOVER_TIMEOUT_S, standby)
            fault.seconds = time.monotonic() - fault_at
            line = took_over(standby.log())
            fault.first_batch_s, fault.standby_batch = float(line["s"]), int(line["batch"])
            if kind == "kill":
                spread.restart(active_host)
            else:
                try:
                    fault.zombie_exit = active.wait(timeout=job.stream_lease_s + 60)
                except subprocess.TimeoutExpired:  # still running when healed: a finding
                    fault.zombie_exit = None
                spread.heal(active_host)
            fault.zombie_batches = batches(active.log())[logged:]
            if fault.zombie_exit is None and kind != "kill":
                active.kill()
            print(f"  fault {n}/{faults}: {kind} of {active_host}: the standby on {standby_host} committed batch "
                  f"{fault.standby_batch} {fault.seconds:.1f} s after it ({fault.first_batch_s:.1f} s of it its "
                  f"first batch)" + (f"; the cut-off driver exited {fault.zombie_exit}" if kind != "kill" else ""),
                  flush=True)
            active, active_host = standby, standby_host
        stop.set()
        producer.join(timeout=30)
        _wait("the last driver draining", lambda: sum(kafka_io.stream_lag(job).values()) == 0, START_TIMEOUT_S,
              active)
        drivers.stop_all()
        done = subprocess.run([sys.executable, "-m", "adpipe", "verify"], env=env, capture_output=True, text=True,
                              check=False)
        (work / "verify.json").write_text(done.stdout)
        verify_ok = done.returncode == 0
    finally:
        stop.set()
        if drivers is not None:
            drivers.stop_all()
        spread.down()
    summary = {"run": run_id, "hosts": host_count, "rate": rate, "trigger_interval_s": job.trigger_interval_s,
               "lease_s": job.stream_lease_s, **summarize(record), "faults_detail": [f.row() for f in record],
               "verify_ok": verify_ok, "logs": str(work)}
    (work / "failover.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
