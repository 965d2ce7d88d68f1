"""A consumer group's state and members, described in a child process of
its own for a caller that must outlive its brokers' deaths.

librdkafka aborts the whole process (``rd_kafka_enq_once_del_source_return:
Assertion `eonce->refcnt > 0' failed``, open in librdkafka 2.16:
https://github.com/confluentinc/librdkafka/issues/4605)
when a group's coordinator cannot be reached during DescribeConsumerGroups:
what a killed broker does to the request in flight. ``adpipe chaos`` kills
brokers and asks the stream's leadership group several times a second; it
asks through :class:`GroupProbe`, whose child answers one question a line.
If the child dies, the question gets a :class:`KafkaException` (as a broker
that does not answer would give) and the next one a new child.

Run as ``python -m adpipe.kafka_io.group_probe``: the child, reading the
Kafka settings from its environment."""

from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import threading
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException

from adpipe.kafka_access import KafkaAccess
from adpipe.kafka_io.groups import GroupMember, group_members

log = logging.getLogger("adpipe.kafka_io")

# Beyond the question's own timeout: the child's start (its imports).
START_ALLOWANCE_S = 20.0


class GroupProbe:
    """Asks a long-lived child process; thread-safe, one question at a time."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.proc: subprocess.Popen | None = None
        self.children = 0
        self._lock = threading.Lock()

    def group_members(
        self, _kafka: KafkaAccess | str | None, group: str, timeout_s: float = 30.0
    ) -> tuple[str, list[GroupMember]]:
        """As :func:`adpipe.kafka_io.group_members` (the Kafka settings are
        the child's environment's): the group's state and live members."""
        with self._lock:
            proc = self._child()
            try:
                proc.stdin.write(json.dumps({"group": group, "timeout_s": timeout_s}) + "\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                ready = select.select([proc.stdout], [], [], timeout_s + START_ALLOWANCE_S)[0]
                line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                line = ""
            if not line:
                self._drop()
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, f"group {group}: the probe gave no answer"))
        answer = json.loads(line)
        if "error" in answer:
            raise KafkaException(KafkaError(KafkaError._FAIL, answer["error"]))
        members = [GroupMember(client_id, host, tuple(topics)) for client_id, host, topics in answer["members"]]
        return answer["state"], members

    def _child(self) -> subprocess.Popen:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        if self.proc is not None:
            log.warning("the group probe ended (exit %s); a new one", self.proc.returncode)
        self.children += 1
        self.proc = subprocess.Popen(  # noqa: S603 - this Python, this module
            [sys.executable, "-m", "adpipe.kafka_io.group_probe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            text=True,
        )
        return self.proc

    def _drop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            log.warning("the group probe gave no answer (exit %s); a new one next time", self.proc.returncode)
            self.proc = None

    def close(self) -> None:
        with self._lock:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.stdin.close()  # type: ignore[union-attr]
                    try:
                        self.proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()
                        self.proc.wait()
                self.proc = None


def main() -> None:
    """The child: one JSON question a line in, one JSON answer a line out."""
    from adpipe.settings import load_settings

    kafka = load_settings().kafka
    for line in sys.stdin:
        question = json.loads(line)
        try:
            state, members = group_members(kafka, question["group"], float(question["timeout_s"]))
            answer: dict = {"state": state, "members": [[m.client_id, m.host, list(m.topics)] for m in members]}
        except Exception as exc:  # noqa: BLE001 - the question's answer, not the child's end
            answer = {"error": str(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
