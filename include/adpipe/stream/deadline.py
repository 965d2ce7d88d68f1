"""A hard deadline on a blocking Kafka client call.

librdkafka's ``send_offsets_to_transaction`` can block past its own timeout
when the group coordinator goes away mid-call (confluentinc/librdkafka#5456
and #5511, open; found here by ``adpipe chaos`` and the broker failover
bench killing the broker that coordinated the stream job's ledger group):
the client's cached coordinator is a broker that left the metadata, and
nothing wakes the request again. A C call cannot be interrupted from Python,
so the call runs on its own thread, and when it outlives its deadline
:class:`CallHung` says so. The sink then leaves that client behind and
carries on with a new one (its ``init_transactions`` fences the stuck one
and aborts its transaction); if that does not help either,
:func:`end_process` ends this process: exactly what a crash before the
commit is, which the restart recovers from (the successor's
``init_transactions`` fences this producer, Spark replays the batch)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# The exit status of a process that ended itself on a hung call: a restart
# recovers (as for a transaction that timed out, adpipe.stream.cli).
EXIT_HUNG = 1


class CallHung(RuntimeError):
    """A Kafka client call outlived its hard deadline: its client is stuck
    in it (its thread is left running) and must not be used again."""


def call_with_deadline(call: Callable[[], T], deadline_s: float, what: str) -> T:
    """``call()``'s result or exception; :class:`CallHung` if it has not
    returned within ``deadline_s``."""
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
        raise CallHung(
            f"{what} did not return within {deadline_s:.0f} s (a Kafka client call blocked past its own "
            "timeout, confluentinc/librdkafka#5456 and #5511)"
        )
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


def end_process(hung: CallHung) -> NoReturn:
    """Log why and end the process with :data:`EXIT_HUNG`, at once: a stuck
    client's threads would hold up an orderly exit."""
    log.error("%s: this process ends now; a restart replays the batch and the open transaction is aborted", hung)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_HUNG)
