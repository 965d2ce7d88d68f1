"""Bodies of the ``ad_union_and_load`` DAG's tasks: one UTC hour each run,
taken from the run's data interval (never from the clock), or from the
``hour`` param of a manual run, so a rerun, a catchup run or a backfill run
of an hour does the same thing. Write-audit-publish, one step per task:

1. ``wait_for_hour_closed`` - every region has closed the hour for good:
   its stream watermark is past the hour's end plus the allowed lateness
   (``ADPIPE_ALLOWED_LATENESS_S``: no window of the hour is revised after
   that), or, for a quiet region, its stream has no lag and the clock is
   past the hour's end plus the watermark delay and the allowed lateness
   (``adpipe.lakehouse.ranges.hour_closed``).
2. ``stage`` - what arrived since the last run, every region, into the
   staging tables, each row in its own hour (``adpipe.lakehouse.load.stage``).
   The staged run (``StagedRun.to_dict``) is the task's XCom: ``validate``,
   ``verify`` and ``publish`` take it from there (Airflow's metadata
   database), whichever worker, host or ``ADPIPE_HOME`` they run on. No step
   hands anything to another through a file.
3. ``validate`` - the Great Expectations gate on each hour the run would
   publish (published plus staged rows, and what Kafka says of the hour);
   a failed expectation of the run's own hour raises ``QualityError``
   naming it; another hour that fails is held (and alerted once) while
   the hours that passed go on to be published.
4. ``verify`` - the independent check: ``adpipe verify --hour H
   --candidate-of-run N --tables-only`` in a process of its own (the tools
   sit above this package): the candidate against counts recomputed in
   plain Python from the raw Kafka records.
5. ``publish`` - the audited rows into the ``ads`` tables, only when no
   check failed (a failed check leaves it upstream_failed: the run fails).

An hour past Kafka's retention of which nothing was ever loaded
(:mod:`adpipe.lakehouse.retention`) fails nothing: ``validate`` logs one
WARNING line naming what Kafka keeps, the ledger a ``past_retention`` row,
and ``validate``, ``verify`` and ``publish`` end *skipped* with that line as
the reason (:func:`past_retention_skip`; no failure alert). Hours the run's
audit passed beside it (staged rows of closed hours) wait for the next
run, which publishes them.
6. ``publish_data_docs`` - beside ``publish``, whatever the checks found: a
   page linking to the hour's Data Docs (``$ADPIPE_HOME/data_docs/<hour>.html``,
   ``latest.html``), never a copy of the site. Nothing waits on it.

Every address and credential a step uses comes from the task's Connections
(:mod:`adpipe.orchestration.connections`)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator

from adpipe.lakehouse.cli import EXIT_PAST_RETENTION
from adpipe.settings import PROJECT_ROOT, Settings

log = logging.getLogger(__name__)

ONE_HOUR = timedelta(hours=1)
# The load DAG's start date when ADPIPE_LOAD_START is unset: any past date
# (no catch-up then: the first run is the hour that closed last when the DAG
# is unpaused).
FIRST_START = datetime(2026, 1, 1, tzinfo=UTC)


class IntervalError(ValueError):
    """The run's data interval is not one whole UTC hour."""


def hour_of_interval(start: datetime | None, end: datetime | None) -> datetime:
    """The UTC hour a run covers: its data interval must be exactly one
    whole hour (the DAG's timetable gives that; a manual run without one
    is refused rather than guessed)."""
    if start is None or end is None:
        raise IntervalError("the run has no data interval")
    start_utc = datetime.fromtimestamp(start.timestamp(), UTC)
    end_utc = datetime.fromtimestamp(end.timestamp(), UTC)
    if end_utc - start_utc != ONE_HOUR or start_utc != start_utc.replace(minute=0, second=0, microsecond=0):
        raise IntervalError(f"data interval {start_utc.isoformat()} .. {end_utc.isoformat()} is not one whole hour")
    return start_utc


# The form of an hour in a DAG's ``hour`` param (Airflow's Param checks it).
HOUR_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}$"


def hour_of_run(params: dict[str, Any] | None, start: datetime | None, end: datetime | None) -> datetime:
    """The hour a run covers: the ``hour`` param when a manual run names one
    (``YYYY-MM-DDTHH``), else its data interval (:func:`hour_of_interval`)."""
    named = (params or {}).get("hour")
    if named:
        from adpipe.lakehouse.ranges import parse_hour

        return parse_hour(str(named))
    return hour_of_interval(start, end)


def hour_is_closed(settings: Settings, hour: datetime) -> bool:
    from adpipe.lakehouse.ranges import hour_closed

    closed = hour_closed(settings, hour)
    log.info("hour %s closed: %s", hour.isoformat(), closed)
    return closed


def _session(settings: Settings, step: str, hour: datetime) -> Any:
    from adpipe.lakehouse.metastore import metastore_session
    from adpipe.lakehouse.ranges import hour_label

    # The tables are found through the Hive metastore: in a task process of
    # its own (Airflow's executors) there is no session yet to reuse.
    return metastore_session(settings, f"adpipe-{step}-{hour_label(hour)}")


class NoStagedRun(ValueError):
    """A step after ``stage`` was given no staged run (the stage task's XCom)."""


def _staged(run: dict[str, Any] | None) -> Any:
    """The ``StagedRun`` of the stage task's XCom."""
    from adpipe.lakehouse import load

    if not run:
        raise NoStagedRun("no staged run: the stage task of this DAG run returned none (its XCom)")
    return load.StagedRun.from_dict(dict(run))


def handed_over(run: dict[str, Any]) -> dict[str, Any]:
    """The staged run as the stage task returns it, its XCom (logged with
    its size). Small and bounded: a few fields, one entry per region read
    (four topics' offsets per partition), and the hours it audits, held or
    asked for (``YYYY-MM-DDTHH`` each): the hours of what arrived since the
    last run, which an hourly run keeps to a few."""
    size = len(json.dumps(run))
    log.info("run %s handed over as this task's XCom: %d bytes of JSON (%d hours to audit, %d regions read)",
             run.get("run_id"), size, len(run.get("hours", [])), len(run.get("read", [])))
    return run


def stage(settings: Settings, hour: datetime) -> dict[str, Any]:
    """In this process: stage the hour's load; the staged run is returned
    (the task's XCom)."""
    from adpipe.lakehouse import load

    run = load.stage(settings, _session(settings, "stage", hour), hour)
    log.info("run %d staged %s; hours to audit: %s", run.run_id, run.staged, ", ".join(run.hours))
    return handed_over(run.to_dict())


def validate(settings: Settings, hour: datetime, run: dict[str, Any] | None) -> dict[str, Any]:
    """In this process: the gate on the staged ``run`` (the stage task's
    XCom). Raises ``QualityError`` (naming every failed expectation of every
    hour) on failure; nothing is then published."""
    from adpipe.lakehouse import load
    from adpipe.lakehouse.quality import QualityError

    staged = _staged(run)
    audited = load.audit(settings, _session(settings, "validate", hour), staged)
    summary = audited.summary(staged.asked_hours())
    if not summary["success"]:
        raise QualityError(summary["describe"], audited.failed_asked(staged.asked_hours())[0])
    log.info("%s", summary["describe"])
    return {"run_id": staged.run_id, "hours": staged.hours, **summary}
    return {"run_id": staged.run_id, "hours": staged.hours, "success": True}




class TablesDisagree(RuntimeError):
    """``adpipe verify --hour`` found the candidate different from Kafka."""


def past_retention_skip(hour: datetime, audit: dict[str, Any] | None) -> str | None:
    """Why ``validate`` ends skipped for the run of ``hour``, or None: its
    ``audit`` (the step's result: :meth:`~adpipe.lakehouse.outcome.Audit.summary`)
    found the hour past Kafka's retention with nothing of it loaded, and no
    hour to publish (:mod:`adpipe.lakehouse.retention`). An hour past
    retention is no failure: the grid shows the run's checks skipped, with
    this line as the reason, and ``publish`` skipped after them; nothing
    alerts."""
    from adpipe.lakehouse.ranges import hour_label

    line = ((audit or {}).get("past_retention") or {}).get(hour_label(hour))
    if line is None or (audit or {}).get("passed"):
        return None
    return f"{line}: nothing to publish"


def _skip(reason: str | None) -> None:
    """Raise Airflow's skip with ``reason`` (logged first), if any."""
    if reason is not None:
        from airflow.sdk.exceptions import AirflowSkipException

        log.warning("skipped: %s", reason)
        raise AirflowSkipException(reason)


def _skip_after(step: str, hour: datetime, result: Any) -> Any:
    """``result``, unless ``validate`` found its hour past retention with
    nothing to publish: then the task ends skipped (:func:`past_retention_skip`)."""
    if step == "validate":
        _skip(past_retention_skip(hour, result))
    return result


def verify(settings: Settings, hour: datetime, run: dict[str, Any] | None, env: dict[str, str] | None = None) -> dict:
    """Run ``adpipe verify --hour --candidate-of-run --tables-only`` on the
    staged ``run`` (the stage task's XCom); raise :class:`TablesDisagree`
    naming what differs."""
    import subprocess
    import sys

    from adpipe.lakehouse.ranges import hour_label

    run_id = _staged(run).run_id
    with tempfile.TemporaryDirectory(prefix="adpipe-verify-") as tmp:
        report_path = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "adpipe", "verify", "--hour", hour_label(hour), "--tables-only",
                   "--candidate-of-run", str(run_id), "--report", str(report_path)]
        log.info("running %s", " ".join(command))
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)  # noqa: S603
        if not report_path.exists():
            raise TablesDisagree(f"verify exited {done.returncode} without a report:\n{done.stderr[-3000:]}")
        tables = json.loads(report_path.read_text())["tables"]
    if done.returncode == EXIT_PAST_RETENTION and tables.get("verdict") == "past_retention":
        _skip(f"verify --hour {tables['hour']}: {tables['past_retention_report']}")
    if done.returncode != 0 or not tables["ok"]:
        parts = [
            f"{name}: {section[key]} {key.removesuffix('_count')}"
            for name, section in tables.items()
            if isinstance(section, dict)
            for key in ("missing_count", "unexpected_count", "duplicated_count", "wrong_count")
            if section.get(key)
        ]
        if tables.get("past_retention_count"):
            parts.append(f"{tables['past_retention_count']} partitions past Kafka retention")
        if tables.get("revisions_over_latest_count"):
            parts.append(f"{tables['revisions_over_latest_count']} revisions counting more than their window's latest")
        counts = ("missing_count", "unexpected_count", "duplicated_count", "wrong_count")
        details = {k: v for k, v in tables.items() if isinstance(v, dict) and any(v.get(c) for c in counts)}
        raise TablesDisagree(
            f"verify --hour {tables['hour']}: run {run_id}'s candidate disagrees with Kafka "
            f"({'; '.join(parts) or 'see the report'}): {json.dumps(details, default=str)[:3000]}"
        )
    log.info("verify --hour %s: the candidate of run %s matches Kafka", tables["hour"], run_id)
    return {k: tables[k] for k in ("hour", "ok", "problems", "regions")}


def publish(settings: Settings, hour: datetime, run: dict[str, Any] | None) -> dict[str, Any]:
    """In this process: publish the audited ``run`` (the stage task's XCom)."""
    from adpipe.lakehouse import load

    done = load.publish(settings, _session(settings, "publish", hour), _staged(run))
    log.info("published %s; late corrections %s", done["inserted"], done["corrections"] or "none")
    return done


_CLI_STEP = {"stage": "stage", "validate": "audit", "publish": "publish"}
STEPS = tuple(_CLI_STEP)


def in_process(step: str, settings: Settings, hour: datetime, run: dict[str, Any] | None) -> Any:
    """The load's ``step`` in this process; ``run``: the staged run (the
    stage task's XCom; None for ``stage``)."""
    if step == "stage":
        return stage(settings, hour)
    return (validate if step == "validate" else publish)(settings, hour, run)


def _check_step(step: str, staged_run: Any) -> str:
    """``step``, when it is one, and it is given the staged run exactly when
    it reads one (every step but ``stage``)."""
    if step not in _CLI_STEP:
        raise ValueError(f"step {step!r}: expected one of {', '.join(STEPS)}")
    if (step == "stage") is not (staged_run is None):
        raise ValueError(
            f"step {step!r}: " + ("stages the run, it is given none" if step == "stage" else
                                  "reads the staged run: give staged_run, the stage task's XCom (its .output)")
        )
    return step


@contextlib.contextmanager
def run_file_here(step: str, run: dict[str, Any] | None) -> Iterator[Path]:
    """The ``--run-file`` of a step that runs in another process on this
    host (the warm load driver, spark-submit's driver in client mode): in a
    temporary folder of this task's own, never under ``ADPIPE_HOME``, gone
    when the step is done. ``run`` (the stage task's XCom) is written to it
    first; the step's result is read back from it or beside it. It hands
    nothing to another task: that is XCom's."""
    from adpipe.lakehouse.load import write_json

    with tempfile.TemporaryDirectory(prefix=f"adpipe-{step}-") as folder:
        path = Path(folder) / "run.json"
        if run is not None:
            write_json(path, dict(run))
        yield path


def _raise_for(step: str, path: Path) -> None:
    """After a failed step: a failed gate as the ``QualityError`` naming
    its expectations (what the audit step wrote beside ``path``)."""
    from adpipe.lakehouse.load import step_file
    from adpipe.lakehouse.quality import QualityError

    audit = step_file(path, "audit")
    if step == "validate" and audit.exists() and not json.loads(audit.read_text())["success"]:
        raise QualityError(json.loads(audit.read_text())["describe"]) from None


def _result(step: str, path: Path) -> Any:
    """What a step run elsewhere (the warm driver, spark-submit) wrote."""
    from adpipe.lakehouse.load import step_file

    if step == "stage":
        return handed_over(json.loads(path.read_text()))
    return json.loads(step_file(path, _CLI_STEP[step]).read_text())


def _run_of(context: Any) -> tuple[dict[str, str], Settings, datetime]:
    """A step's Connections' values (adpipe.orchestration.connections: the
    worker's environment under them is the step's), settings and hour."""
    from adpipe.orchestration.connections import connection_env
    from adpipe.settings import load_settings

    overlay = connection_env()
    settings = load_settings({**os.environ, **overlay})
    hour = hour_of_run(context.get("params"), context.get("data_interval_start"), context.get("data_interval_end"))
    return overlay, settings, hour


class WarmLoadOperator(BaseOperator):
    """Base of the operators that run an ``adpipe load`` command in the
    home's warm load driver (adpipe.lakehouse.warm) on the worker's host.

    Killed (its ``execution_timeout``, a SIGTERM from Airflow) while the warm
    load driver runs its command, it kills that driver too: a command that
    hangs there would otherwise hold the driver, and the load lock, for every
    step after it. The next step starts another driver and recovers what the
    killed one left, as after any killed load."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._warm: tuple[Settings, int] | None = None

    def _delegate(
        self, env: dict[str, str], settings: Settings, argv: list[str], out: io.TextIOBase, err: io.TextIOBase
    ) -> int | None:
        """``adpipe <argv>``'s exit status in the home's warm load driver
        (started if none runs), its output to ``out`` and ``err``; None when
        none can run it (none became ready, a session of other settings)."""
        from adpipe.lakehouse import warm

        driver = warm.ensure_driver(settings, env=env)
        if driver is None:
            return None
        # Kept while the driver may run the command: a timeout interrupts
        # the call below, then Airflow calls on_kill.
        self._warm = (settings, driver.pid)
        code = warm.delegate(settings, argv, start=True, env=env, out=out, err=err)
        self._warm = None
        return code

    def on_kill(self) -> None:
        if self._warm is not None:
            from adpipe.lakehouse import warm

            settings, pid = self._warm
            warm.kill_driver(settings, pid)


class LoadStepOperator(WarmLoadOperator):
    """One Spark step of the load (``stage``, ``validate`` or ``publish``)
    on the worker's host: in the home's warm load driver
    (``ADPIPE_LOAD_SUBMIT=warm``, the default; killed with the step,
    :class:`WarmLoadOperator`), or in the task's own process
    (``in-process``, or with ``ADPIPE_SPARK_CONNECT`` as a client of the
    load's Spark Connect server). No spark-submit runs here, so this is no
    ``SparkSubmitOperator``: with ``ADPIPE_LOAD_SUBMIT=spark-submit`` the DAG
    builds :class:`LoadStepSubmitOperator` instead (:func:`load_step`). The
    hour comes from the run's ``hour`` param or data interval. ``stage``
    returns the staged run (its XCom); every later step is given it as
    ``staged_run`` (templated: the stage task's ``.output``, pulled from
    XCom when the step runs, on whatever worker). Returns the step's result
    (XCom)."""

    template_fields = ("staged_run",)

    def __init__(self, *, step: str, staged_run: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = _check_step(step, staged_run)
        self.staged_run = staged_run

    def execute(self, context: Any) -> Any:
        overlay, settings, hour = _run_of(context)
        if self.step != "stage":
            _staged(self.staged_run)  # refused before any Spark work
        # With the load's Spark Connect servers the task's own process is a
        # client of a warm session (any host's; its own host's started when
        # none answers, as a warm driver would be), no warm driver of its host.
        if settings.spark_connect:
            from adpipe.lakehouse.connect_client import ensure_server

            ensure_server(settings, env={**os.environ, **overlay})  # the Connections' values too
        if settings.load_submit == "in-process" or settings.spark_connect:
            return _skip_after(self.step, hour, in_process(self.step, settings, hour, self.staged_run))
        if settings.load_submit != "warm":
            raise RuntimeError(
                f"ADPIPE_LOAD_SUBMIT={settings.load_submit} here, but the DAG was parsed without it: "
                "set it where the DAG files are parsed too"
            )
        return _skip_after(self.step, hour, self._in_warm_driver({**os.environ, **overlay}, settings, hour))

    def _in_warm_driver(self, env: dict[str, str], settings: Settings, hour: datetime) -> Any:
        """The step in the home's warm load driver (started if none runs):
        no Spark start for it; the run goes to it, and its result comes
        back, in :func:`run_file_here`. Where none can serve it (none became
        ready, a session of other settings), in this task's process instead."""
        from adpipe.lakehouse.ranges import hour_label

        with run_file_here(self.step, self.staged_run) as path:
            argv = ["load", "--hour", hour_label(hour), "--step", _CLI_STEP[self.step], "--run-file", str(path)]
            lines = LogLines(self.log)
            code = self._delegate(env, settings, argv, lines, lines)
            if code is None:
                self.log.warning("no warm load driver took the step: running it in this process")
                return in_process(self.step, settings, hour, self.staged_run)
            if code != 0:
                _raise_for(self.step, path)
                raise RuntimeError(f"the {self.step} step exited {code} in the warm load driver (see above)")
            return _result(self.step, path)


class LoadSubmitOperator(SparkSubmitOperator):
    """Base of the operators that submit ``adpipe load`` as a Spark
    application of its own, ``spark-submit jobs/union_and_load.py ...``,
    through the Spark provider (connection ``adpipe_spark``: master, deploy
    mode, spark-submit binary), for an executor whose tasks run on other
    hosts (``ADPIPE_LOAD_SUBMIT=spark-submit``). The application's settings
    are the worker's environment with its Connections' values
    (``env_vars``); its Spark conf and jars are adpipe's (``adpipe.spark``).
    Its public arguments are filled in when it runs (:meth:`submit`), then
    the provider's own ``execute`` submits it and waits; ``on_kill`` is the
    provider's (it kills spark-submit)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("application", str(PROJECT_ROOT / "jobs" / "union_and_load.py"))
        kwargs.setdefault("conn_id", "adpipe_spark")
        super().__init__(**kwargs)

    def submit(self, context: Any, overlay: dict[str, str], settings: Settings, name: str, args: list[str]) -> None:
        """Submit ``adpipe load <args>`` as the application ``name``, and wait."""
        from adpipe.lakehouse.metastore import metastore_conf
        from adpipe.orchestration.stream_supervisor import submit_conf

        self.name = name
        self.conf, self.jars = submit_conf(settings, self.name, metastore_conf(settings))
        self.application_args = args
        # The job reads its settings from its environment, as any adpipe
        # process: the worker's, with the Connections' values over it.
        self.env_vars = overlay or None
        super().execute(context)


class LoadStepSubmitOperator(LoadSubmitOperator):
    """One Spark step of the load submitted as a Spark application of its
    own, ``spark-submit jobs/union_and_load.py --step ... --run-file F``
    (:class:`LoadSubmitOperator`); the hour is the run's. ``staged_run`` as
    :class:`LoadStepOperator`'s (the stage task's XCom); ``F`` is a file of
    this task's own (:func:`run_file_here`): the application's driver runs
    on this host (spark-submit's client deploy mode, the provider's default)."""

    template_fields = (*LoadSubmitOperator.template_fields, "staged_run")

    def __init__(self, *, step: str, staged_run: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = _check_step(step, staged_run)
        self.staged_run = staged_run

    def execute(self, context: Any) -> Any:  # type: ignore[override]
        from adpipe.lakehouse.ranges import hour_label

        overlay, settings, hour = _run_of(context)
        if self.step != "stage":
            _staged(self.staged_run)  # refused before spark-submit starts
        with run_file_here(self.step, self.staged_run) as path:
            args = ["--hour", hour_label(hour), "--step", _CLI_STEP[self.step], "--run-file", str(path)]
            try:
                self.submit(context, overlay, settings, f"adpipe-load-{self.step}-{hour_label(hour)}", args)
            except Exception:
                _raise_for(self.step, path)
                raise
            return _skip_after(self.step, hour, _result(self.step, path))


def load_step(step: str, submit: str, **kwargs: Any) -> BaseOperator:
    """The operator of the load's ``step`` for ``ADPIPE_LOAD_SUBMIT=submit``
    (read where the DAG is parsed): :class:`LoadStepSubmitOperator` when
    spark-submit runs it, else :class:`LoadStepOperator`."""
    if submit == "spark-submit":
        return LoadStepSubmitOperator(step=step, **kwargs)
    return LoadStepOperator(step=step, **kwargs)


class LogLines(io.TextIOBase):
    """A text stream whose lines go to ``logger`` (a task's log); the last
    ``keep`` of them stay in ``lines``."""

    def __init__(self, logger: logging.Logger, keep: int = 0) -> None:
        self.logger, self.pending, self.keep = logger, "", keep
        self.lines: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.logger.info("%s", line)
        if self.keep:
            self.lines = [*self.lines, *lines][-self.keep:]
        return len(text)


def publish_data_docs(settings: Settings, hour: datetime) -> str | None:
    """Write ``$ADPIPE_HOME/data_docs/<hour>.html``: links to the Data Docs
    site and to the hour's validation pages in it (never a copy of the
    site), and point ``latest.html`` at it. Runs after a failed gate too.
    Returns the page's file: URI, or None when no Data Docs were built."""
    from html import escape

    from adpipe.lakehouse.quality import docs_site
    from adpipe.lakehouse.ranges import hour_label

    site = docs_site(settings)
    if site is None:
        log.warning("no Data Docs site under %s yet; nothing to link", settings.home)
        return None
    tag = hour_label(hour)
    pages = sorted(site.glob(f"validations/**/adpipe-{tag}/**/*.html"))
    root = settings.home / "data_docs"
    root.mkdir(parents=True, exist_ok=True)
    links = "\n".join(
        f'<li><a href="{escape(p.resolve().as_uri())}">{escape(str(p.relative_to(site)))}</a></li>' for p in pages
    )
    index = (site / "index.html").resolve().as_uri()
    body = (
        f"<!doctype html><meta charset=utf-8><title>adpipe Data Docs {tag}</title>"
        f"<h1>Great Expectations, hour {tag}</h1><p><a href=\"{escape(index)}\">Data Docs site</a></p>"
        f"<ul>\n{links or '<li>no validation of this hour in the site</li>'}\n</ul>\n"
    )
    page = root / f"{tag}.html"
    page.write_text(body)
    tmp = root / ".latest.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(page.name)
    tmp.replace(root / "latest.html")
    log.info("Data Docs of %s: %s (%d validation pages)", tag, page.resolve().as_uri(), len(pages))
    return page.resolve().as_uri()
