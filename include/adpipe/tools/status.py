"""``adpipe status``: what of the local set-up is up, where it listens and
where its log is.

One row per part: the Kafka broker (or cluster), PostgreSQL, the stream job
(its last committed batch, from the checkpoint, and its lag: the row is
``status_stream``'s), the budget service (its consumer group's members and
lag), the warm load driver, the Spark standalone cluster and Airflow. Each
row's state is one of

* ``up``: runs and answers;
* ``degraded``: runs, but not as it should (a broker or PostgreSQL that does
  not answer, a stalled stream job, a Spark cluster with workers missing,
  an unhealthy Airflow scheduler);
* ``down``: does not run;
* ``unknown``: cannot be told (its probe failed or timed out, or the budget
  service's process runs while the broker that knows its group is down).

Reading, never changing: nothing is started, created or locked (the stream
job's drivers are read from its leadership group's members, never joined),
and ``ADPIPE_HOME`` need not exist. Every probe has a short timeout and runs in
a thread of its own under a deadline, so a silent server costs seconds, not
a hang: the servers in parallel first, then the two parts whose lag needs
the broker."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from adpipe.settings import Settings, SettingsError, load_settings
from adpipe.tools.status_common import (  # noqa: F401 - the rows' parts, as before the split
    CALL_TIMEOUT_S,
    DEGRADED,
    DOWN,
    UNKNOWN,
    UP,
    Component,
    ago,
    existing,
    proc_text,
    reason,
    stderr_file,
    utc_text,
)
from adpipe.tools.status_stream import (  # noqa: F401 - the stream row, as before the split
    CheckpointProgress,
    checkpoint_progress,
    described_stream_settings,
    stream_component,
    with_note,
)

# All probes of one stage together; a probe still running then is "unknown".
STAGE_TIMEOUT_S = 8.0
# The budget service's lag is counted record by record up to this many offsets.
EXACT_LAG_OFFSETS = 10_000
# What a budget service's command line says after `adpipe budget` when it is
# not the service but one of its one-off actions.
BUDGET_ACTIONS = ("report", "prices", "prune")


# ---------------------------------------------------------------- processes


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
    environ = proc_text(pid, "environ")
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
        if is_budget_service(proc_text(pid, "cmdline")) and _same_budget_group(pid, settings):
            found.append(pid)
    return sorted(found)


# ------------------------------------------------------------------- probes


def kafka_component(settings: Settings) -> Component:
    from adpipe.local import kafka_broker

    cluster = kafka_broker.status(settings)
    nodes = cluster.nodes
    logs = existing(*(n.log_file for n in kafka_broker.nodes(settings)))
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
    logs = existing(postgres.log_file(settings))
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
    logs = existing(spark_cluster.log_file(settings, "master"), *(w.log for w in cluster.workers))
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
    logs = existing(airflow.airflow_home(settings) / "logs")
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


def budget_component(settings: Settings, kafka_up: bool) -> Component:
    """Up: its consumer group has members on the aggregates topic (any
    host). Lag from the offsets it commits to Kafka after each database
    commit (for monitoring; its true position is in its database)."""
    from adpipe import kafka_io

    address = f"group {settings.budget_group}"
    pids = budget_processes(settings)
    logs = existing(*(stderr_file(p) for p in pids))
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
        parts.append(f"group unknown ({reason(exc)})")
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
        parts.append(f"lag unknown ({reason(exc)})")
    parts.append(f"db {facts['database']}")
    return Component("budget", state, address, "; ".join(parts), logs, facts)


def load_component(settings: Settings) -> Component:
    """The home's warm load driver (``adpipe load --serve``): up when it
    answers; optional (without one, each load starts its own Spark)."""
    from adpipe.lakehouse import warm
    from adpipe.stream.liveness import process_alive

    logs = existing(warm.log_file(settings))
    driver = warm.read_driver(settings)
    if driver is None:
        return Component("load", DOWN, "", "no warm load driver (optional: adpipe load --serve)", logs)
    address = f"{warm.HOST}:{driver.port}"
    facts = {"pid": driver.pid, "started_at": driver.started_at}
    if warm.ping(settings) is not None:
        detail = f"warm load driver pid {driver.pid}, since {driver.started_at}"
        return Component("load", UP, address, detail, logs, facts)
    if process_alive(driver.pid):
        return Component("load", DEGRADED, address, f"warm load driver pid {driver.pid} does not answer", logs, facts)
    return Component("load", DOWN, "", f"the warm load driver pid {driver.pid} is gone (killed?)", logs, facts)


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
            results[name] = Component(name, UNKNOWN, addresses.get(name, ""), f"the probe failed: {reason(exc)}")

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
        "load": "",
    }
    servers = run_bounded(
        {
            "kafka": lambda: kafka_component(settings),
            "postgres": lambda: postgres_component(settings),
            "spark": lambda: spark_component(settings),
            "airflow": lambda: airflow_component(settings),
            "load": lambda: load_component(settings),
        },
        addresses,
        stage_timeout_s,
    )
    kafka_up = servers[0].state == UP
    stream_settings, stream_note = described_stream_settings(settings)
    jobs = run_bounded(
        {
            "stream": lambda: with_note(stream_component(stream_settings, kafka_up), stream_note),
            "budget": lambda: budget_component(settings, kafka_up),
        },
        addresses,
        stage_timeout_s,
    )
    kafka, postgres, spark, airflow, load = servers
    return [kafka, postgres, *jobs, load, spark, airflow]


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
        "checked_at": utc_text(now),
        "adpipe_home": str(settings.home),
        "home_exists": settings.home.is_dir(),
        "components": [{**asdict(c), "logs": list(c.logs)} for c in components],
    }


def home_line(settings: Settings) -> str:
    suffix = "" if settings.home.is_dir() else " (does not exist yet: nothing was started with it)"
    return f"ADPIPE_HOME {settings.home}{suffix}"
