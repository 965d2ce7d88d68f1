"""A hard deadline on a blocking Kafka client call.

librdkafka's ``send_offsets_to_transaction`` can block past its own timeout
when the group coordinator goes away mid-call (confluentinc/librdkafka#5456,
open; found here by ``adpipe chaos`` killing the broker that coordinated the
stream job's ledger group): the job then hangs for good, its transaction
open until the broker aborts it. A C call cannot be interrupted from Python,
so the call runs on its own thread, and when it outlives its deadline this
process ends itself: exactly what a crash before the commit is, which the
restart recovers from (the broker aborts the open transaction, the successor's
``init_transactions`` fences this producer, Spark replays the batch)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# The exit status of a process that ended itself on a hung call: a restart
# recovers (as for a transaction that timed out, adpipe.stream.cli).
EXIT_HUNG = 1


def call_with_deadline(call: Callable[[], T], deadline_s: float, what: str) -> T:
    """``call()``'s result or exception; if it has not returned within
    ``deadline_s``, log why and end the process with :data:`EXIT_HUNG`."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, name=f"deadline: {what}", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        log.error(
            "%s did not return within %.0f s (a Kafka client call blocked past its own timeout, "
            "confluentinc/librdkafka#5456): this process ends now; a restart replays the batch "
            "and the open transaction is aborted",
            what,
            deadline_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_HUNG)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]
