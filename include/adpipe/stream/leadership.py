"""One active stream driver per job, across any number of hosts: the
driver that holds the one partition of the job's leadership topic in its
leadership consumer group leads; every other driver of the job is a
standby (``adpipe stream --standby``) or is refused at start.

Why a Kafka group rather than a file lock or a lease file beside the
checkpoint: the job already needs Kafka and its checkpoint and nothing
else, and the group gives what a lease must, on the brokers' clock:

- **one leader**: the group coordinator assigns the partition to one
  member at a time, in numbered generations (the epochs, claimed by the
  coordinator, atomically); a member that joins never takes it from a live
  leader (cooperative-sticky assignment);
- **a takeover within seconds** when the leader's host dies, freezes or is
  cut off: its session expires after ``ADPIPE_STREAM_LEASE_S`` (6 s: the
  brokers' smallest session by default) without a heartbeat, and the
  coordinator hands the partition to a standby; a leader that stops cleanly
  leaves the group and hands it over at once;
- **a leader cut off from the brokers lapses**: the same missed heartbeats
  that let a standby take over tell the old leader, once its session has
  expired, that its assignment is lost, and it ends itself (exit 4) before
  it could commit anything (it cannot reach the brokers to commit anyway,
  and its producer is fenced by the new leader's ``init_transactions``);
- **no clock of any host** decides: the coordinator times the sessions.

A file lock guards one host, and a lease on the checkpoint's file system
would need the driver to prove on each renewal that it still reaches the
brokers, with expiries read against other hosts' clocks. What stays per
host: nothing; ``adpipe status`` reads the group (its members' client ids
name host and pid)."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from adpipe import kafka_io
from adpipe.settings import Settings

log = logging.getLogger("adpipe.stream")

# What a standby driver logs once warm (adpipe.stream.driver), waiting for
# the leadership: what tools and tests that watch a standby read in its log.
STANDBY_WARM_LINE = "standby: warm in "
# What a driver that lost the leadership exits with (adpipe.stream.cli.EXIT_FENCED).
EXIT_FENCED = 4
CLIENT_PREFIX = "adpipe-stream"


class CheckpointInUseError(RuntimeError):
    """Another live driver leads this job."""


leadership_group = kafka_io.leadership_group


# How a consumer group is described: (Kafka, group, timeout s) -> (state, members).
Describe = Callable[[object, str, float], tuple[str, list[kafka_io.GroupMember]]]


@dataclass(frozen=True)
class Driver:
    """A driver in the job's leadership group, from its client id."""

    host: str
    pid: int
    leads: bool

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def client_id() -> str:
    return f"{CLIENT_PREFIX}:{socket.gethostname()}:{os.getpid()}"


def _driver(member: kafka_io.GroupMember, topic: str) -> Driver | None:
    parts = member.client_id.split(":")
    if len(parts) != 3 or parts[0] != CLIENT_PREFIX or not parts[2].isdigit():
        return None
    return Driver(parts[1], int(parts[2]), topic in member.topics)


def drivers(settings: Settings, timeout_s: float = 10.0, describe: Describe | None = None) -> list[Driver]:
    """The job's live drivers, the leader first (none when the group is
    empty or the brokers do not answer). ``describe``: how the group is
    described (default :func:`adpipe.kafka_io.group_members`; a
    :class:`adpipe.kafka_io.group_probe.GroupProbe`'s in a process that
    kills brokers)."""
    group = leadership_group(settings.job_id)
    _state, members = (describe or kafka_io.group_members)(settings.kafka, group, timeout_s)
    found = [d for d in (_driver(m, group) for m in members) if d is not None]
    return sorted(found, key=lambda d: not d.leads)


def leader(settings: Settings, timeout_s: float = 10.0) -> Driver | None:
    found = drivers(settings, timeout_s)
    return found[0] if found and found[0].leads else None


def leader_or_none(settings: Settings) -> Driver | None:
    """:func:`leader`, or None when the group cannot be described now (the
    membership itself decides; this only names the leader)."""
    try:
        return leader(settings)
    except KafkaException as exc:
        log.debug("the leadership group %s not described: %s", leadership_group(settings.job_id), exc)
        return None


class Leadership:
    """This driver's membership of the job's leadership group, polled from
    a thread of its own (its heartbeats go on while Spark runs a batch).
    ``leading`` is set once the coordinator assigns the partition; if it is
    taken away afterwards (revoked or lost: the session expired), the
    process ends at once with :data:`EXIT_FENCED`."""

    def __init__(self, settings: Settings) -> None:
        self.group = leadership_group(settings.job_id)
        kafka_io.ensure_topics(settings.kafka, [self.group], 1)
        lease_ms = settings.stream_lease_s * 1000
        self.consumer = Consumer(
            kafka_io.client_config(
                settings.kafka,
                {
                    "group.id": self.group,
                    "client.id": client_id(),
                    "group.protocol": "classic",
                    "partition.assignment.strategy": "cooperative-sticky",
                    "session.timeout.ms": lease_ms,
                    "heartbeat.interval.ms": max(500, lease_ms // 6),
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                },
            )
        )
        self.leading = threading.Event()
        self.stopped = threading.Event()
        self.consumer.subscribe([self.group], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)
        self.thread = threading.Thread(target=self._poll, name="stream-leadership", daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stopped.is_set():
            self.consumer.poll(0.2)  # callbacks run here; no record is ever produced to the topic

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            log.info("the leadership group assigned this driver the job (member %s)", consumer.memberid())
            self.leading.set()

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and self.leading.is_set() and not self.stopped.is_set():
            self._fenced("the group moved the leadership to another driver")

    def _lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and self.leading.is_set() and not self.stopped.is_set():
            self._fenced("this driver's session with the brokers expired (cut off, or paused)")

    @staticmethod
    def _fenced(why: str) -> None:
        log.error("fenced: %s: another driver leads the job now; stopping", why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_FENCED)

    def close(self) -> None:
        """Leave the group: a standby takes the leadership at once."""
        self.stopped.set()
        self.thread.join(timeout=5)
        self.consumer.close()


def _wait_for_no_leader(settings: Settings) -> None:
    """Return once no driver leads the job, or raise naming the one that
    does. A driver killed (SIGKILL, its host gone) stays in the group until
    its session expires, so a leader is given one lease, and a little more,
    to leave before this driver gives up: a live one keeps its session."""
    deadline = time.monotonic() + settings.stream_lease_s * 1.5 + 2
    current = leader_or_none(settings)
    if current is not None:
        dead_here = current.host == socket.gethostname() and not _pid_alive(current.pid)
        log.info("job %s: %s leads in the group%s; waiting up to %.0f s for its session to end",
                 settings.job_id, current.describe(), " (that process has ended)" if dead_here else "",
                 deadline - time.monotonic())
    while current is not None:
        if time.monotonic() >= deadline:
            raise CheckpointInUseError(
                f"job {settings.job_id} is led by another stream driver ({current.describe()}); stop it first, "
                "or start this one with --standby"
            )
        time.sleep(0.5)
        current = leader_or_none(settings)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def leadership(settings: Settings, standby: bool = False) -> Iterator[str | None]:
    """Lead the job for the block, or raise at once naming the driver that
    leads it. With ``standby``, wait instead until the leadership is this
    driver's (its leader ended, stopped, froze or was cut off). Yields None,
    or for a standby the reason it took over."""
    if not standby:
        _wait_for_no_leader(settings)
    membership = Leadership(settings)
    took_over = None
    try:
        if standby:
            log.info("standby: waiting to lead job %s (group %s)", settings.job_id, membership.group)
            current = None
            me = (socket.gethostname(), os.getpid())
            while not membership.leading.wait(0.5):
                found = leader_or_none(settings)
                # The group may name this driver a moment before its own
                # callback runs: the one that left is the leader seen before.
                if found is not None and (found.host, found.pid) != me:
                    current = found
            took_over = "the leader left the group" if current is None else f"{current.describe()} left the group"
        elif not membership.leading.wait(settings.stream_lease_s * 3 + 10):
            current = leader_or_none(settings)
            raise CheckpointInUseError(
                f"job {settings.job_id}: the leadership group did not assign this driver its partition"
                + ("" if current is None else f" ({current.describe()} leads)")
            )
        log.info("leading job %s (%s)", settings.job_id, client_id())
        yield took_over
    finally:
        membership.close()


def wait_until_led_by(settings: Settings, pid: int, timeout_s: float) -> bool:
    """Whether the driver of ``pid`` on this host leads within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    host = socket.gethostname()
    while time.monotonic() < deadline:
        current = leader(settings, timeout_s=5)
        if current is not None and (current.host, current.pid) == (host, pid):
            return True
        time.sleep(0.2)
    return False
