"""``adpipe status``: what of the local set-up is up, where it listens and
where its log is.

One row per part: the Kafka broker (or cluster), PostgreSQL, the stream job
(its last committed batch, from the checkpoint, and its lag), the budget
service (its consumer group's members and lag), the Spark standalone cluster
and Airflow. Each row's state is one of

* ``up``: runs and answers;
* ``degraded``: runs, but not as it should (a broker or PostgreSQL that does
  not answer, a stalled stream job, a Spark cluster with workers missing,
  an unhealthy Airflow scheduler);
* ``down``: does not run;
* ``unknown``: cannot be told (its probe failed or timed out, or the budget
  service's process runs while the broker that knows its group is down).

Reading, never changing: nothing is started, created or locked (the stream
job's checkpoint lock is read from the kernel's lock table), and
``ADPIPE_HOME`` need not exist. Every probe has a short timeout and runs in
a thread of its own under a deadline, so a silent server costs seconds, not
a hang: the servers in parallel first, then the two parts whose lag needs
the broker."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from adpipe.settings import Settings, SettingsError, load_settings

UP, DEGRADED, DOWN, UNKNOWN = "up", "degraded", "down", "unknown"
# One network call of a probe (a metadata request, pg_isready, an HTTP GET).
CALL_TIMEOUT_S = 2.0
# All probes of one stage together; a probe still running then is "unknown".
STAGE_TIMEOUT_S = 8.0
# The budget service's lag is counted record by record up to this many offsets.
EXACT_LAG_OFFSETS = 10_000
# What a budget service's command line says after `adpipe budget` when it is
# not the service but one of its one-off actions.
BUDGET_ACTIONS = ("report", "prices", "prune")


@dataclass(frozen=True)
class Component:
    """One row of the report."""

    name: str
    state: str
    address: str = ""
    detail: str = ""
    logs: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)  # the detail's numbers, for --json


@dataclass(frozen=True)
class CheckpointProgress:
    """What a stream job's Spark checkpoint says it has done."""

    last_committed: int | None  # newest commits/N: the batch's output is final
    committed_at: float | None  # when that commit was written (epoch s)
    newest_planned: int | None  # newest offsets/N: a batch Spark has started
    planned_at: float | None  # when Spark started it (its offsets entry written)
    watermark_ms: int | None  # the event-time watermark the last committed batch ran with
    end_offsets: dict[int, int] = field(default_factory=dict)  # where that batch stopped reading, per partition

    @property
    def uncommitted(self) -> int | None:
        """A batch started and not committed: running now, or (after a
        crash) replayed at the next start."""
        if self.newest_planned is None or (
            self.last_committed is not None and self.newest_planned <= self.last_committed
        ):
            return None
        return self.newest_planned


def checkpoint_progress(root: Path) -> CheckpointProgress | None:
    """Read a local checkpoint folder (None: there is none). Spark writes
    ``offsets/N`` before it runs batch N and ``commits/N`` after its sink
    returned (:mod:`adpipe.stream.offset_log`)."""
    from adpipe.stream.offset_log import LocalCheckpoint, OffsetLogError, batch_offsets, last_committed_batch

    if not root.is_dir():
        return None
    files = LocalCheckpoint(root)
    planned = [int(name) for name in files.names("offsets") if name.isdigit()]
    last = last_committed_batch(files)
    committed_at = watermark = None
    end: dict[int, int] = {}
    if last is not None:
        try:
            committed_at = (root / "commits" / str(last)).stat().st_mtime
            batch = batch_offsets(files, last)
            watermark, end = batch.watermark_ms, batch.end
        except (OSError, OffsetLogError, ValueError):  # a checkpoint being written, or damaged: say what is known
            pass
    newest = max(planned) if planned else None
    planned_at = _mtime(root / "offsets" / str(newest)) if newest is not None else None
    return CheckpointProgress(last, committed_at, newest, planned_at, watermark, end)


def ago(seconds: float) -> str:
    """``12 s ago``, ``4 min ago``, ``3 h ago``, ``2 d ago``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _utc(epoch_s: float) -> str:
    from adpipe.stream.job import iso_utc

    return iso_utc(int(epoch_s * 1000))


def _existing(*paths: Path | str | None) -> tuple[str, ...]:
    return tuple(str(p) for p in paths if p and Path(p).exists())


# ---------------------------------------------------------------- processes


def _proc_text(pid: int, name: str) -> list[str]:
    """A ``/proc/<pid>`` file of NUL-separated strings (cmdline, environ)."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def adpipe_arguments(argv: list[str]) -> list[str] | None:
    """The arguments after the ``adpipe`` command in a command line
    (``.venv/bin/adpipe budget``, ``python -m adpipe budget``), or None
    when it is not one."""
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] == "adpipe":
            return argv[i + 2 :]
        if Path(arg).name == "adpipe" and i <= 1:  # the script itself, or the interpreter running it
            return argv[i + 1 :]
    return None


def is_budget_service(argv: list[str]) -> bool:
    """``adpipe [-v] budget [--once] [--timeout S]``, not one of its actions."""
    args = adpipe_arguments(argv)
    if not args:
        return False
    words = [a for a in args if not a.startswith("-")]
    return bool(words) and words[0] == "budget" and not set(words[1:]) & set(BUDGET_ACTIONS)


def _same_budget_group(pid: int, settings: Settings) -> bool:
    """The process consumes the same topic in the same group on the same
    cluster as these settings (by its environment; True when that cannot be
    read)."""
    environ = _proc_text(pid, "environ")
    if not any(environ):
        return True
    env = dict(item.split("=", 1) for item in environ if "=" in item)
    try:
        theirs = load_settings(env)
    except SettingsError:
        return False
    return (theirs.budget_group, theirs.kafka_bootstrap, theirs.topics.aggregates) == (
        settings.budget_group,
        settings.kafka_bootstrap,
        settings.topics.aggregates,
    )


def budget_processes(settings: Settings) -> list[int]:
    """Budget services running on this host for this group and cluster."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        if is_budget_service(_proc_text(pid, "cmdline")) and _same_budget_group(pid, settings):
            found.append(pid)
    return sorted(found)


def stderr_file(pid: int) -> str | None:
    """The file a process writes its stderr to (None: a terminal, a pipe)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    return target if target.startswith("/") and not target.startswith("/dev/") and Path(target).is_file() else None


# ------------------------------------------------------------------- probes


def kafka_component(settings: Settings) -> Component:
    from adpipe.local import kafka_broker

    cluster = kafka_broker.status(settings)
    nodes = cluster.nodes
    logs = _existing(*(n.log_file for n in kafka_broker.nodes(settings)))
    facts = {
        "nodes": [
            {"node_id": n.node_id, "pid": n.pid, "answering": n.answering, "bootstrap": n.bootstrap} for n in nodes
        ],
        "secure": cluster.secure,
    }
    pids = ", ".join(str(n.pid) for n in nodes if n.pid)
    how = ", SASL_SSL" if cluster.secure else ""
    answering = sum(n.answering for n in nodes)
    if answering == len(nodes) and cluster.running:
        state, detail = UP, f"pid {pids}{how}" if len(nodes) == 1 else f"{len(nodes)} nodes, pids {pids}{how}"
    elif answering == len(nodes):
        state, detail = UP, "answers, but was not started from this ADPIPE_HOME"
    elif answering or any(n.running for n in nodes):
        state = DEGRADED
        detail = f"{answering} of {len(nodes)} nodes answer" + (f" (pids {pids})" if pids else "")
    else:
        state, detail = DOWN, "not running (adpipe kafka up)"
    return Component("kafka", state, cluster.bootstrap, detail, logs, facts)


def postgres_component(settings: Settings) -> Component:
    from adpipe.local import postgres

    found = postgres.status(settings)
    logs = _existing(postgres.log_file(settings))
    if found.running and found.answering:
        state, detail = UP, "our cluster"
    elif found.answering:
        state, detail = UP, "answers, but is not a cluster of this ADPIPE_HOME"
    elif found.running:
        state, detail = DEGRADED, "our cluster runs but does not answer (starting, or unhealthy)"
    else:
        state, detail = DOWN, "not running (adpipe pg up)"
    return Component("postgres", state, found.address, detail, logs, {"ours": found.running})


def spark_component(settings: Settings) -> Component:
    from adpipe.local import spark_cluster

    cluster = spark_cluster.status(settings)
    alive = sum(w.alive for w in cluster.workers)
    logs = _existing(spark_cluster.log_file(settings, "master"), *(w.log for w in cluster.workers))
    facts = {"master_pid": cluster.master_pid, "workers": len(cluster.workers), "workers_alive": alive}
    if cluster.master_pid is None and not cluster.master_answering:
        state, detail = DOWN, f"not running; jobs run on ADPIPE_SPARK_MASTER={settings.spark_master}"
    elif cluster.master_pid is None:
        state, detail = UP, f"answers, but was not started from this ADPIPE_HOME; UI {cluster.ui_url}"
    else:
        state = UP if cluster.running and cluster.answering else DEGRADED
        detail = (
            f"master pid {cluster.master_pid}, {alive} of {len(cluster.workers)} workers alive, UI {cluster.ui_url}"
        )
    return Component("spark", state, cluster.master_url, detail, logs, facts)


def airflow_component(settings: Settings) -> Component:
    from adpipe.local import airflow

    address = f"http://127.0.0.1:{settings.airflow_port}"
    logs = _existing(airflow.airflow_home(settings) / "logs")
    report = airflow.health(settings.airflow_port, CALL_TIMEOUT_S)
    if report is None:
        return Component("airflow", DOWN, address, "not running (make airflow)", logs)
    statuses = {
        part: (report.get(part) or {}).get("status")
        for part in ("metadatabase", "scheduler", "dag_processor", "triggerer")
    }
    unhealthy = [part for part, status in statuses.items() if status not in ("healthy", None)]
    state = DEGRADED if unhealthy else UP
    detail = ", ".join(f"{part} {status}" for part, status in statuses.items() if status is not None)
    return Component("airflow", state, address, detail, logs, {"health": statuses})


def stream_component(settings: Settings, kafka_up: bool, now: float | None = None) -> Component:
    """Alive: a driver holds the checkpoint's lock (a job started by hand or
    by the supervisor on this host), or the supervisor's pid runs. Its last
    batch from the checkpoint (a local one) or else its heartbeat; its lag
    from the broker (raw records not yet committed by its transactions).
    Stalled by the supervisor's own rule (:func:`liveness.input_stalled`,
    the rule it restarts a job by): input waits and for
    ADPIPE_STREAM_STALL_S the job has neither finished a batch nor polled.
    With the lag unknown (the broker does not answer): a batch started more
    than ADPIPE_STREAM_STALL_S ago and not committed yet."""
    from adpipe.stream import checkpoint_lock, liveness

    now = time.time() if now is None else now
    supervised = liveness.read_state(settings)
    supervised_pid = supervised.get("pid") if liveness.process_alive(supervised.get("pid")) else None
    # The active driver renews the lease; the lock's holder differs from it
    # only while a paused driver that a standby took over from still lives.
    lease = checkpoint_lock.read_lease(settings)
    fresh = lease is not None and lease.host == os.uname().nodename and now - lease.at <= settings.stream_lease_s
    lock_holder = checkpoint_lock.holder(settings)
    pid = (lease.pid if fresh and lease else None) or lock_holder or supervised_pid
    try:
        progress = checkpoint_progress(settings.checkpoint_dir)
    except SettingsError:  # hdfs://, s3a://: the heartbeat says what the last batch was
        progress = None
    standby = checkpoint_lock.waiters(settings)
    facts: dict[str, Any] = {"job_id": settings.job_id, "pid": pid, "standby_pids": standby}
    beat = liveness.read_heartbeat(settings)
    parts = [f"pid {pid}" if pid else "not running"]
    if pid and lease is not None and lease.pid == pid:
        facts["lease_age_s"] = round(now - lease.at, 1)
        if not fresh:
            parts.append(f"its lease is {now - lease.at:.0f} s old (paused or frozen?)")
    if lock_holder and lock_holder != pid:
        facts["fenced_pid"] = lock_holder
        parts.append(f"pid {lock_holder} was taken over from (fenced) and still holds the lock")
    if standby:
        parts.append("standby pid " + ", ".join(map(str, standby)) + " (takes over when it ends)")
    failover = liveness.read_failover(settings)
    if failover is not None:
        facts["last_failover"] = failover
        parts.append(f"last failover{_at(failover.get('at'), now)}: {failover.get('reason')}, "
                     f"next batch {failover.get('seconds')} s after")
    parts.append(_last_batch(progress, beat, facts, now))
    lag = _stream_lag(settings, kafka_up, facts)
    stalled = False
    if pid and facts["lag"] is not None:
        started_at = supervised.get("started_at") if pid == supervised_pid else liveness.process_started_at(pid)
        stalled = liveness.input_stalled(
            facts["lag"], now, settings.stream_stall_s, beat["at"] if beat else None,
            liveness.polled_at(settings), started_at or 0.0,
        )
    if progress is not None and progress.uncommitted is not None:
        facts["uncommitted_batch"] = progress.uncommitted
        running_s = now - (progress.planned_at or now)
        if not pid:
            parts.append(f"batch {progress.uncommitted} started, not committed: replayed at the next start")
        elif facts["lag"] is None and running_s > settings.stream_stall_s:
            stalled = True
            parts.append(f"batch {progress.uncommitted} stalled: running for {running_s:.0f} s")
        else:
            parts.append(f"batch {progress.uncommitted} running for {running_s:.0f} s")
    parts.append(lag)
    if stalled and facts["lag"] is not None:
        parts.append(
            f"stalled: input waits and no batch finished nor poll for over {settings.stream_stall_s} s "
            "(the supervisor restarts it)"
        )
    facts["stalled"] = stalled
    state = DEGRADED if stalled else (UP if pid else DOWN)
    logs = _existing(stderr_file(pid) if pid else None, supervised.get("log"))
    return Component("stream", state, settings.checkpoint_uri, "; ".join(parts), logs, facts)


def _last_batch(
    progress: CheckpointProgress | None, beat: dict[str, Any] | None, facts: dict[str, Any], now: float
) -> str:
    """The last committed batch: the checkpoint's (a local one), else the
    heartbeat's (the last batch the job finished, wherever its checkpoint)."""
    if progress is not None and progress.last_committed is not None:
        batch, at, watermark = progress.last_committed, progress.committed_at, progress.watermark_ms
        facts["end_offsets"] = progress.end_offsets
    elif beat is not None:
        batch, at, watermark = beat.get("batch_id"), beat.get("at"), beat.get("watermark_ms")
    else:
        facts["last_batch"] = None
        return "no batch committed yet"
    facts.update(last_batch=batch, last_batch_at=at, watermark_ms=watermark)
    return f"last batch {batch}" + _at(at, now)


def _stream_lag(settings: Settings, kafka_up: bool, facts: dict[str, Any]) -> str:
    from adpipe import kafka_io

    facts["lag"] = None
    if not kafka_up:
        return "lag unknown (the broker does not answer)"
    try:
        by_partition = kafka_io.stream_lag(settings, timeout_s=CALL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the row still says what else is known
        return f"lag unknown ({_reason(exc)})"
    facts.update(lag=sum(by_partition.values()), lag_by_partition=by_partition)
    return f"lag {facts['lag']} records"


def budget_component(settings: Settings, kafka_up: bool) -> Component:
    """Up: its consumer group has members on the aggregates topic (any
    host). Lag from the offsets it commits to Kafka after each database
    commit (for monitoring; its true position is in its database)."""
    from adpipe import kafka_io

    address = f"group {settings.budget_group}"
    pids = budget_processes(settings)
    logs = _existing(*(stderr_file(p) for p in pids))
    facts: dict[str, Any] = {"group": settings.budget_group, "pids": pids, "database": _redacted(settings.budget_db)}
    here = f"pid {', '.join(map(str, pids))}" if pids else ""
    if not kafka_up:
        if pids:
            return Component("budget", UNKNOWN, address, f"{here} runs; the broker does not answer", logs, facts)
        return Component("budget", DOWN, address, "not running (adpipe budget)", logs, facts)
    parts = [here] if here else []
    try:
        group_state, members = kafka_io.group_members(settings.kafka, settings.budget_group, CALL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - e.g. no Describe right on the group: the row says so
        group_state, members = None, []
        parts.append(f"group unknown ({_reason(exc)})")
    # Members of the group that read another topic (a demo's, a chaos run's) are not this service.
    ours = [m for m in members if not m.topics or settings.topics.aggregates in m.topics]
    facts.update(group_state=group_state, members=[asdict(m) for m in ours])
    if group_state is None:
        state = UNKNOWN
    elif ours:
        hosts = sorted({m.host for m in ours})
        parts.append(f"{len(ours)} consumer(s) in the group ({', '.join(hosts)})")
        state = UP
    elif pids:
        parts.append("runs, but is not in its group yet (starting, or cannot reach the broker)")
        state = DEGRADED
    else:
        parts.append("not running (adpipe budget)")
        state = DOWN
    try:
        lag, exact = budget_lag(settings)
        facts["lag"] = lag
        parts.append(f"lag {lag} aggregates" if exact else f"lag about {lag} aggregates")
    except Exception as exc:  # noqa: BLE001 - the row still says what else is known
        facts["lag"] = None
        parts.append(f"lag unknown ({_reason(exc)})")
    parts.append(f"db {facts['database']}")
    return Component("budget", state, address, "; ".join(parts), logs, facts)


def budget_lag(settings: Settings) -> tuple[int, bool]:
    """Aggregates after the offsets the budget service committed to Kafka,
    and whether that is exact. The topic is written in transactions, each
    leaving a marker at an offset of its own: a service that read everything
    stands a few offsets short of the end. Up to EXACT_LAG_OFFSETS offsets
    the records in between are counted; beyond, offsets stand for records."""
    from adpipe import kafka_io

    topic = settings.topics.aggregates
    ends = kafka_io.end_offsets(settings.kafka, topic, timeout_s=CALL_TIMEOUT_S)
    done = kafka_io.group_commits(settings.kafka, settings.budget_group, topic, CALL_TIMEOUT_S)
    ranges = {p: (done.get(p, (0, ""))[0], end) for p, end in ends.items() if end > done.get(p, (0, ""))[0]}
    offsets = sum(end - start for start, end in ranges.values())
    if offsets > EXACT_LAG_OFFSETS:
        return offsets, False
    return sum(kafka_io.readable_records(settings.kafka, topic, ranges, CALL_TIMEOUT_S).values()), True


def _at(epoch_s: float | None, now: float) -> str:
    return "" if epoch_s is None else f" at {_utc(epoch_s)} ({ago(now - epoch_s)})"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _reason(exc: Exception) -> str:
    text = str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _redacted(url: str) -> str:
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as nothing, never in full
        return "(not a database URL)"


# ------------------------------------------------------------------ running


def run_bounded(
    probes: dict[str, Callable[[], Component]], addresses: dict[str, str], timeout_s: float
) -> list[Component]:
    """Run the probes side by side, each in a daemon thread (one that hangs
    past ``timeout_s`` is left behind, and reported ``unknown``)."""
    results: dict[str, Component] = {}

    def run(name: str, probe: Callable[[], Component]) -> None:
        try:
            results[name] = probe()
        except Exception as exc:  # noqa: BLE001 - one failed probe is one unknown row
            results[name] = Component(name, UNKNOWN, addresses.get(name, ""), f"the probe failed: {_reason(exc)}")

    threads = [
        threading.Thread(target=run, args=item, name=f"status-{item[0]}", daemon=True) for item in probes.items()
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        results.get(name) or Component(name, UNKNOWN, addresses.get(name, ""), f"no answer within {timeout_s:g} s")
        for name in probes
    ]


def collect(settings: Settings, stage_timeout_s: float = STAGE_TIMEOUT_S) -> list[Component]:
    """Every part's row: the servers first (side by side), then the stream
    job and the budget service, whose lag needs the broker."""
    addresses = {
        "kafka": settings.kafka_bootstrap,
        "postgres": f"{settings.pg_host}:{settings.pg_port}",
        "stream": settings.checkpoint_uri,
        "budget": f"group {settings.budget_group}",
        "spark": f"spark://127.0.0.1:{settings.spark_master_port}",
        "airflow": f"http://127.0.0.1:{settings.airflow_port}",
    }
    servers = run_bounded(
        {
            "kafka": lambda: kafka_component(settings),
            "postgres": lambda: postgres_component(settings),
            "spark": lambda: spark_component(settings),
            "airflow": lambda: airflow_component(settings),
        },
        addresses,
        stage_timeout_s,
    )
    kafka_up = servers[0].state == UP
    stream_settings, stream_note = _stream_settings(settings)
    jobs = run_bounded(
        {
            "stream": lambda: _noted(stream_component(stream_settings, kafka_up), stream_note),
            "budget": lambda: budget_component(settings, kafka_up),
        },
        addresses,
        stage_timeout_s,
    )
    kafka, postgres, spark, airflow = servers
    return [kafka, postgres, *jobs, spark, airflow]


def _stream_settings(settings: Settings) -> tuple[Settings, str]:
    """The settings the stream row describes: these, or, when this home's
    own job never ran and ``adpipe demo`` did, the last demo run's job (its
    own topics and job id), with a note saying so."""
    from adpipe.stream import liveness

    try:
        ran = settings.checkpoint_dir.exists()
    except SettingsError:  # a remote checkpoint: its heartbeat says
        ran = False
    if ran or liveness.read_heartbeat(settings) or liveness.read_state(settings).get("pid"):
        return settings, ""
    try:
        latest = json.loads((settings.home / "demo" / "latest.json").read_text())
        demo = load_settings({**os.environ, "ADPIPE_HOME": str(settings.home), **latest["env"]})
    except (OSError, ValueError, KeyError, TypeError, SettingsError):
        return settings, ""
    return demo, f"the last demo's job {demo.job_id} (job {settings.job_id} never ran here)"


def _noted(row: Component, note: str) -> Component:
    if not note:
        return row
    return replace(row, detail=f"{note}: {row.detail}", facts={**row.facts, "described": note})


# --------------------------------------------------------------- reporting


def format_table(components: list[Component]) -> str:
    """One aligned row per part: name, state, address, detail, log (the
    first log file; ``(+N)`` when there are more, all of them in --json)."""
    header = ("COMPONENT", "STATE", "ADDRESS", "DETAIL", "LOG")
    rows = [
        (
            c.name,
            c.state,
            c.address or "-",
            c.detail or "-",
            (c.logs[0] + (f" (+{len(c.logs) - 1})" if len(c.logs) > 1 else "")) if c.logs else "-",
        )
        for c in components
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)), row[-1]]).rstrip()
        for row in (header, *rows)
    )


def report(settings: Settings, components: list[Component], now: float | None = None) -> dict[str, Any]:
    """The --json form."""
    now = time.time() if now is None else now
    return {
        "checked_at": _utc(now),
        "adpipe_home": str(settings.home),
        "home_exists": settings.home.is_dir(),
        "components": [{**asdict(c), "logs": list(c.logs)} for c in components],
    }


def home_line(settings: Settings) -> str:
    suffix = "" if settings.home.is_dir() else " (does not exist yet: nothing was started with it)"
    return f"ADPIPE_HOME {settings.home}{suffix}"
