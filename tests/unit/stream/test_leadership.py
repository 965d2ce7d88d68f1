"""What a standby says when it takes over: the leader it saw waiting, never
itself (the group may name it a moment before its own assignment callback
runs; a test of hosts on one machine met it). The group itself is tested
with a real broker in tests/integration/test_leadership.py."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from adpipe.settings import load_settings
from adpipe.stream import leadership
from adpipe.stream.leadership import Driver


class _Membership:
    """A membership the group assigns on the fourth wait."""

    group = "adpipe-agg-job-leader"

    def __init__(self, _settings: object) -> None:
        self.waits = 0
        self.closed = False
        outer = self

        class _Leading:
            def wait(self, _timeout: float) -> bool:
                outer.waits += 1
                return outer.waits > 3

        self.leading = _Leading()

    def close(self) -> None:
        self.closed = True


def test_a_standby_names_the_leader_that_left_not_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    me = Driver(socket.gethostname(), os.getpid(), True)
    seen = iter([Driver("host-a", 11, True), None, me])  # the old leader, a moment of none, then this driver
    monkeypatch.setattr(leadership, "Leadership", _Membership)
    monkeypatch.setattr(leadership, "leader_or_none", lambda _settings: next(seen))
    with leadership.leadership(load_settings({"ADPIPE_HOME": str(tmp_path)}), standby=True) as took_over:
        assert took_over == "pid 11 on host-a left the group"
