"""The body of the ``ad_hour_repair`` DAG: an operator's action on one hour
that a failed quality gate holds, chosen in Airflow's trigger form.

An hour whose gate failed is *held*: its rows stay staged, later loads
leave it alone, and one alert names it (adpipe.lakehouse.load). The form
has two params, checked by Airflow against their JSON schema before the run
is created (a bad value is refused with the param's description):

* ``hour`` — the held hour, ``YYYY-MM-DDTHH`` (UTC; the alert names it);
* ``action`` — ``repair`` or ``discard_staged``.

Each action is the command line's, run by the same code
(:func:`adpipe.lakehouse.repair.hour_action`):

=================  ==================================================
``repair``         ``adpipe load --hour H --repair --held-only``: the
                   hour rebuilt from Kafka, audited by the same gate,
                   written over its published partitions
``discard_staged`` ``adpipe load --hour H --discard-staged --held-only``:
                   the hour's staged rows deleted; its published rows
                   stand
=================  ==================================================

``--held-only``: on an hour no failed gate holds, nothing changes and the
task fails naming the hour's last ledger step (:class:`HourNotHeld`). A
repair whose audit fails again writes nothing and fails naming the
expectations (the hour stays held). On success the task's result (XCom)
and log end with the rows of the hour now published, per table.

Where it runs: as the load's Spark steps (``ADPIPE_LOAD_SUBMIT``): in the
home's warm load driver (the default), in the task's process
(``in-process``), or as ``spark-submit jobs/union_and_load.py`` with the
same arguments (``spark-submit``)."""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime
from typing import Any

from adpipe.lakehouse.cli import EXIT_NOT_HELD
from adpipe.lakehouse.errors import HourNotHeld
from adpipe.orchestration.load_tasks import HOUR_PATTERN, LoadSubmitOperator, LogLines, WarmLoadOperator
from adpipe.settings import Settings

log = logging.getLogger(__name__)

# The form's choices; the command line's flag of each.
ACTIONS = {"repair": "--repair", "discard_staged": "--discard-staged"}


class ActionError(ValueError):
    """The run's params name no hour or no action this DAG takes."""


class HourActionFailed(RuntimeError):
    """The action ran and failed (a repair's gate failed again, a table write
    failed): the message says why."""


def hour_and_action(params: dict[str, Any] | None) -> tuple[datetime, str]:
    """The hour and the action a run's params ask for. Airflow checks the
    form against the params' schema; a run made otherwise is checked here,
    with the same rules."""
    from adpipe.lakehouse.ranges import parse_hour

    params = params or {}
    hour, action = params.get("hour"), params.get("action")
    if not isinstance(hour, str) or not re.match(HOUR_PATTERN, hour):
        raise ActionError(f"param hour={hour!r}: give the held hour as YYYY-MM-DDTHH (UTC), e.g. 2026-11-22T12")
    if action not in ACTIONS:
        raise ActionError(f"param action={action!r}: expected one of {', '.join(ACTIONS)}")
    return parse_hour(hour), action


def action_args(hour: datetime, action: str) -> list[str]:
    """``adpipe load``'s arguments for ``action`` on ``hour``."""
    from adpipe.lakehouse.ranges import hour_label

    return ["--hour", hour_label(hour), ACTIONS[action], "--held-only"]


def _error_text(lines: list[str]) -> str:
    """Why a command failed: its log from its last ERROR line on (the
    command's own verdict, which may run over several lines; a part may
    have logged an error before it), without the log line's time, level
    and logger (adpipe.cli's format)."""
    last = next((n for n in range(len(lines) - 1, -1, -1) if " ERROR " in lines[n]), None)
    if last is None:
        return "\n".join(lines[-5:])
    said = [lines[last].split(" ERROR ", 1)[1].split(": ", 1)[-1], *lines[last + 1:]]
    return "\n".join(said)[:4000]


def _announce_repair(context: Any, hour: datetime, action: str) -> None:
    """After a repair: one event of each published table's Asset, through the
    task's alias (adpipe.orchestration.assets.REPAIRED_TABLES)."""
    from adpipe.lakehouse.ranges import hour_label
    from adpipe.orchestration.assets import REPAIRED_TABLES, TABLE_ASSETS

    if action != "repair":
        return
    events = context["outlet_events"][REPAIRED_TABLES]
    for asset in TABLE_ASSETS:
        events.add(asset, extra={"hour": hour_label(hour), "action": action})


def _result(hour: datetime, action: str, said: str) -> dict[str, str]:
    from adpipe.lakehouse.ranges import hour_label

    log.info("%s", said)
    return {"hour": hour_label(hour), "action": action, "result": said}


class HourActionOperator(WarmLoadOperator):
    """The form's action on its held hour (module doc), on the worker's
    host: in the home's warm load driver (``ADPIPE_LOAD_SUBMIT=warm``, killed
    with the task, :class:`WarmLoadOperator`) or in the task's own process
    (``in-process``; with ``ADPIPE_SPARK_CONNECT``, as a client of the load's
    Spark Connect server). Returns ``{"hour", "action", "result"}`` (XCom)."""

    def execute(self, context: Any) -> dict[str, str]:
        from adpipe.orchestration.connections import connection_env
        from adpipe.settings import load_settings

        hour, action = hour_and_action(context.get("params"))
        env = {**os.environ, **connection_env()}
        settings = load_settings(env)
        if settings.spark_connect:
            from adpipe.lakehouse.connect_client import ensure_server

            ensure_server(settings, env=env)  # this host's, when none answers (as a warm driver would be)
        if settings.load_submit == "in-process" or settings.spark_connect:
            said = self._here(settings, hour, action)
        elif settings.load_submit == "warm":
            said = self._in_warm_driver(env, settings, hour, action)
        else:
            raise RuntimeError(
                f"ADPIPE_LOAD_SUBMIT={settings.load_submit} here, but the DAG was parsed without it: "
                "set it where the DAG files are parsed too"
            )
        _announce_repair(context, hour, action)
        return _result(hour, action, said)

    def _here(self, settings: Settings, hour: datetime, action: str) -> str:
        from adpipe.lakehouse import repair

        return repair.hour_action(settings, hour, action, held_only=True)

    def _in_warm_driver(self, env: dict[str, str], settings: Settings, hour: datetime, action: str) -> str:
        out, err = LogLines(self.log, keep=5), LogLines(self.log, keep=200)
        argv = ["load", *action_args(hour, action)]
        code = self._delegate(env, settings, argv, out, err)
        if code is None:
            self.log.warning("no warm load driver took the action: running it in this process")
            return self._here(settings, hour, action)
        if code == EXIT_NOT_HELD:
            raise HourNotHeld(_error_text(err.lines))
        if code != 0:
            raise HourActionFailed(f"adpipe {' '.join(argv)} exited {code}: {_error_text(err.lines)}")
        return next((line for line in reversed(out.lines) if line.strip()), f"adpipe {' '.join(argv)}: done")


class HourActionSubmitOperator(LoadSubmitOperator):
    """The form's action submitted as a Spark application of its own,
    ``spark-submit jobs/union_and_load.py --hour H --repair|--discard-staged
    --held-only`` (:class:`LoadSubmitOperator`; ``ADPIPE_LOAD_SUBMIT=spark-submit``).
    Its output, the reason of a failure included, is in the task's log."""

    def execute(self, context: Any) -> dict[str, str]:  # type: ignore[override]
        from adpipe.lakehouse.ranges import hour_label
        from adpipe.orchestration.connections import connection_env
        from adpipe.settings import load_settings

        hour, action = hour_and_action(context.get("params"))
        overlay = connection_env()
        settings = load_settings({**os.environ, **overlay})
        self.submit(context, overlay, settings, f"adpipe-{action}-{hour_label(hour)}", action_args(hour, action))
        _announce_repair(context, hour, action)
        return _result(hour, action, f"{action} of {hour_label(hour)} done (its output is above)")


def hour_action_operator(submit: str, **kwargs: Any) -> HourActionOperator | HourActionSubmitOperator:
    """The action's operator for ``ADPIPE_LOAD_SUBMIT=submit`` (read where
    the DAG is parsed), as :func:`adpipe.orchestration.load_tasks.load_step`."""
    if submit == "spark-submit":
        return HourActionSubmitOperator(**kwargs)
    return HourActionOperator(**kwargs)
