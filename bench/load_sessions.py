"""``python -m bench --load-sessions``: where the load's verbs get their
Spark session, timed from the outside on the same hour: a session of their
own per command (``ADPIPE_LOAD_WARM=off``), the home's warm load driver
(one host's), and the load's Spark Connect server (``adpipe connect serve``,
any host's). Each way loads the hour into a warehouse and metastore
database of its own with the tables in place (a command of the hour before
created them and, for the two servers, started them), then times the
hour's load, its rerun and its validation. The server's own start is timed
apart (paid once, not per step)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from adpipe import kafka_io
from adpipe.lakehouse import load
from adpipe.local import kafka_broker, postgres
from adpipe.settings import Settings, load_settings
from adpipe.tools import demo, produce

from bench.stages import _drop_database, database_name, new_run, timed_command

WAYS = ("process", "warm", "connect")
CONNECT_PORT_OFFSET = 7  # above the metrics ports: the Connect server's port is the load metrics port + 7


def _start_connect(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen, float]:
    started = time.monotonic()
    out = log_path.open("w")
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "adpipe", "connect", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    while "Spark Connect server on" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() - started > 300:
            raise RuntimeError(f"the Spark Connect server did not start; see {log_path}")
        time.sleep(0.2)
    return proc, time.monotonic() - started


def _one_way(way: str, env: dict[str, str], run_id: str, work: Path, hour: str, before: str) -> dict:
    env = {
        **env,
        "ADPIPE_WAREHOUSE_URI": (work / f"warehouse-{way}").as_uri(),
        "ADPIPE_METASTORE_DATABASE": database_name(run_id, f"_metastore_{way}"),
        "ADPIPE_LOAD_WARM": {"process": "off", "warm": "on", "connect": "off"}[way],
    }
    result: dict = {"way": way}
    server = None
    if way == "connect":
        settings = load_settings(env)
        env["ADPIPE_SPARK_CONNECT"] = f"sc://127.0.0.1:{settings.load_metrics_port + CONNECT_PORT_OFFSET}"
        server, result["server_start_s"] = _start_connect(env, work / f"connect-{way}.log")
    try:
        started = time.monotonic()
        timed_command(env, work / f"prepare-{way}.log", "validate", "--hour", before)
        if way == "warm":
            result["server_start_s"] = round(time.monotonic() - started, 1)  # the first command starts it
        for name, args in (("load_s", ("load", "--hour", hour)), ("rerun_s", ("load", "--hour", hour)),
                           ("validate_s", ("validate", "--hour", hour))):
            result[name] = round(timed_command(env, work / f"{name}-{way}.log", *args), 1)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(120)
        if way == "warm":
            from adpipe.lakehouse import warm

            warm.stop_driver(load_settings(env))
        _drop_database(load_settings(env), env["ADPIPE_METASTORE_DATABASE"])
    if "server_start_s" in result:
        result["server_start_s"] = round(result["server_start_s"], 1)
    return result


def run(settings: Settings, events: int = 20_000, seed: int = 7, ads: int = 50, minutes: int = 30) -> dict:
    """Produce ``events`` over ``minutes`` of one hour, stream them, then time
    the hour's load, rerun and validation each of the three ways."""
    run_id, work = new_run(settings, "load-sessions")
    env = demo.demo_env(settings, run_id)
    kafka_broker.up(settings)
    postgres.up(settings)
    kafka_io.ensure_pipeline_topics(settings, load_settings(env).topics)
    spec = produce.ProduceSpec(events=events, seed=seed, ads=ads, minutes=minutes)
    produce.send(settings.kafka, load_settings(env).topics.events, produce.plan(spec))
    # Past the hour's end plus the allowed lateness (300 s): the stream closes the hour.
    closing = produce.ProduceSpec(events=10, seed=seed + 1, minutes=1,
                                  start=spec.start + timedelta(hours=1, minutes=10))
    produce.send(settings.kafka, load_settings(env).topics.events, produce.plan(closing))
    timed_command(env, work / "stream.log", "stream", "--available-now")
    hour, before = load.hour_label(spec.start), load.hour_label(spec.start - timedelta(hours=1))
    result = {"events": events, "ads": ads, "minutes": minutes, "cpus": _cpus(),
              "ways": [_one_way(way, env, run_id, work, hour, before) for way in WAYS]}
    (work / "load-sessions.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))
