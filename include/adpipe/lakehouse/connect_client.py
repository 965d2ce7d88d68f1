"""A client's side of the load's Spark Connect servers
(adpipe.lakehouse.connect_server): this host's server started when none
answers (``ADPIPE_LOAD_WARM=on``), as a warm load driver is."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from adpipe.settings import Settings

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0


def log_file(settings: Settings) -> Path:
    """Where a server a client started writes its log."""
    return settings.log_dir / "connect-server.log"


def ensure_server(
    settings: Settings, timeout_s: float = START_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> str | None:
    """The first of ``ADPIPE_SPARK_CONNECT``'s servers that answers, or this
    host's, started now (detached, its log in :func:`log_file`; ``env``: its
    environment, default this process's, as ``settings`` were read from)
    when none does and this host is one of them; None when none answers and
    this host is none of them, or its server did not become ready within
    ``timeout_s``."""
    from adpipe.processes import start_detached
    from adpipe.spark import answering_server, connect_address

    url = answering_server(settings)
    if url is not None:
        return url
    try:
        host, port = connect_address(settings)
    except RuntimeError as exc:
        log.warning("no Spark Connect server answers, and none is this host's to start: %s", exc)
        return None
    path = log_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fault plan is a request's, never the server's.
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("ADPIPE_FAULT")}
    proc = start_detached([sys.executable, "-m", "adpipe", "connect", "serve"], path, env=env)
    log.info("no Spark Connect server answers: starting this host's on sc://%s:%d (pid %d; its log: %s)",
             host, port, proc.pid, path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = answering_server(settings)
        if url is not None:
            return url
        if proc.poll() is not None:
            log.warning("this host's Spark Connect server exited %s before it answered (its log: %s)",
                        proc.returncode, path)
            return answering_server(settings, wait_s=5.0)  # another client's may have won the port
        time.sleep(0.5)
    log.warning("this host's Spark Connect server did not answer within %.0f s (its log: %s)", timeout_s, path)
    return None
