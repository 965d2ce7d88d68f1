"""The healthchecks of the adpipe containers of docker-compose.yaml.

    python -m adpipe.tools.container_health stream|standby|budget

* ``stream``: a driver in this container (this host name) leads the job in
  its leadership group (:mod:`adpipe.stream.leadership`), so it is past its
  start checks and owns the checkpoint. Read from the group's description,
  never by joining it.
* ``standby``: a driver in this container is a member of that group,
  waiting (a standby) or leading (the standby took over).
* ``budget``: the budget consumer group (``ADPIPE_BUDGET_GROUP``) has a
  member, so an instance is consuming the aggregates.

Exit 0 when healthy, 1 otherwise, with one line saying why."""

from __future__ import annotations

import argparse
import socket
import sys

from adpipe import kafka_io
from adpipe.settings import Settings, load_settings
from adpipe.stream import leadership


def _here(settings: Settings) -> list[leadership.Driver]:
    host = socket.gethostname()
    return [d for d in leadership.drivers(settings) if d.host == host]


def stream_health(settings: Settings) -> tuple[bool, str]:
    leading = [d for d in _here(settings) if d.leads]
    if leading:
        return True, f"stream {settings.job_id}: {leading[0].describe()} leads the job"
    return False, f"stream {settings.job_id}: no driver in this container leads the job"


def standby_health(settings: Settings) -> tuple[bool, str]:
    here = _here(settings)
    waiting = [d for d in here if not d.leads]
    if waiting:
        return True, f"stream {settings.job_id}: standby {waiting[0].describe()} waits to lead the job"
    return stream_health(settings)


def budget_health(settings: Settings, timeout_s: float = 10.0) -> tuple[bool, str]:
    group = settings.budget_group
    try:
        described = kafka_io.admin(settings.kafka).describe_consumer_groups([group], request_timeout=timeout_s)
        members = described[group].result(timeout=timeout_s).members
    except Exception as exc:  # noqa: BLE001 - any failure to ask is "not healthy", said in the line
        return False, f"budget: consumer group {group} not described: {exc}"
    if members:
        return True, f"budget: consumer group {group} has {len(members)} member(s)"
    return False, f"budget: consumer group {group} has no member"


CHECKS = {"stream": stream_health, "standby": standby_health, "budget": budget_health}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("service", choices=sorted(CHECKS))
    args = parser.parse_args(argv)
    healthy, why = CHECKS[args.service](load_settings())
    print(why)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
