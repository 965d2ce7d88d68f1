"""The healthchecks of the adpipe containers of docker-compose.yaml.

    python -m adpipe.tools.container_health stream|standby|budget

* ``stream``: a driver in this container holds the job's checkpoint lock
  (:mod:`adpipe.stream.checkpoint_lock`), so it is past its start checks and
  owns the checkpoint. Read from the kernel's lock table, never by taking the
  lock, which could make a driver starting at that instant refuse to run.
* ``standby``: a standby driver waits for that lock (listed in the kernel's
  lock table as its waiter), or a driver holds it (the standby took over).
* ``budget``: the budget consumer group (``ADPIPE_BUDGET_GROUP``) has a
  member, so an instance is consuming the aggregates.

Exit 0 when healthy, 1 otherwise, with one line saying why."""

from __future__ import annotations

import argparse
import sys

from adpipe import kafka_io
from adpipe.settings import Settings, load_settings
from adpipe.stream.checkpoint_lock import holder, waiters


def stream_health(settings: Settings) -> tuple[bool, str]:
    pid = holder(settings)
    if pid:
        return True, f"stream {settings.job_id}: pid {pid} holds the checkpoint {settings.checkpoint_uri}"
    return False, f"stream {settings.job_id}: no driver holds the checkpoint {settings.checkpoint_uri}"


def standby_health(settings: Settings) -> tuple[bool, str]:
    waiting = waiters(settings)
    if waiting:
        return True, f"stream {settings.job_id}: standby pid {waiting[0]} waits for the checkpoint"
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
