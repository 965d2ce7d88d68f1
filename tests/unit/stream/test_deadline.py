"""A blocking call past its deadline ends the process (a real child
process, so the test sees the exit status and the log line)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from adpipe.stream.deadline import EXIT_HUNG, call_with_deadline


def test_a_call_within_its_deadline_returns_or_raises() -> None:
    assert call_with_deadline(lambda: 42, 5, "quick") == 42
    with pytest.raises(ValueError, match="boom"):
        call_with_deadline(lambda: (_ for _ in ()).throw(ValueError("boom")), 5, "failing")


def test_a_call_past_its_deadline_ends_the_process() -> None:
    code = (
        "import logging, threading\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from adpipe.stream.deadline import call_with_deadline\n"
        "call_with_deadline(threading.Event().wait, 1.0, 'send_offsets_to_transaction')\n"
        "print('not reached')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == EXIT_HUNG
    assert "not reached" not in proc.stdout
    assert "send_offsets_to_transaction did not return within 1 s" in proc.stderr
