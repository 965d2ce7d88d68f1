"""The warm load driver: Union & Load without a Spark start per step.

A load step started as a process of its own pays for a JVM, a Spark
session, the Hive client's first connection and Great Expectations' import
before it reads a record: 30-45 s on two cores, most of a small hour's load.
The warm load driver (``adpipe load --serve``) pays that once. One process
per ``ADPIPE_HOME`` holds the session on the metastore and runs, one at a
time, the verbs that use it (``load``, ``validate``, ``maintain`` and
``verify --hour``) for clients on this host: ``adpipe load ...`` itself,
and the load DAG's steps with ``ADPIPE_LOAD_SUBMIT=warm``. A client sends
its command line and its ``ADPIPE_*`` environment over loopback and gets
the verb's output, log lines and exit status back, as if it had run the
verb itself.

- One driver per home: it holds ``load/warm.lock`` (flock) for its life
  and, once warm, writes ``load/warm.json`` (pid, port, the token a client
  must present, and the fingerprint of its session's Spark settings).
- A request whose session settings differ (another metastore, warehouse,
  master, jars) is refused and runs in the client's own process, as does
  any request when no driver answers (``ADPIPE_LOAD_WARM``: ``auto`` uses
  a driver that runs, ``on`` starts one, ``off`` never uses one).
- A failure is a process's: a driver killed mid-request leaves what a
  killed load leaves, which the next load recovers (ledger, staging, the
  load lock), and the client exits 137 naming it. A client that goes away
  does not stop the verb it started.
- It exits after ``ADPIPE_LOAD_WARM_IDLE_S`` without a request, on SIGTERM
  (after the request it runs), or when its Spark session is gone."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import io
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from adpipe.files import write_json
from adpipe.settings import Settings

log = logging.getLogger(__name__)

EXIT_DRIVER_DIED = 137  # what a shell reports for a SIGKILLed process
EXIT_ANOTHER_DRIVER = 4
ENV_PREFIX = "ADPIPE_"
HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0
# True in the driver itself: the verbs it runs never delegate again.
SERVING = False


@dataclass(frozen=True)
class Driver:
    """What ``load/warm.json`` says of the home's warm load driver."""

    pid: int
    port: int
    token: str
    fingerprint: str
    started_at: str


def info_file(settings: Settings) -> Path:
    return settings.home / "load" / "warm.json"


def log_file(settings: Settings) -> Path:
    return settings.log_dir / "load-warm.log"


def _lock_file(settings: Settings) -> Path:
    return settings.home / "load" / "warm.lock"


def session_fingerprint(settings: Settings) -> str:
    """The Spark settings a load's session is built with (adpipe.spark's,
    the metastore's), hashed: two processes with the same one would build
    the same session."""
    from adpipe.lakehouse.metastore import metastore_conf
    from adpipe.spark import spark_conf

    conf = spark_conf(settings, "adpipe-load-warm", metastore_conf(settings))
    return hashlib.sha256(json.dumps(conf, sort_keys=True).encode()).hexdigest()[:16]


def read_driver(settings: Settings) -> Driver | None:
    try:
        body = json.loads(info_file(settings).read_text())
        return Driver(**{name: body[name] for name in Driver.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _send(sock: socket.socket, body: dict) -> None:
    sock.sendall((json.dumps(body) + "\n").encode())


def ping(settings: Settings) -> Driver | None:
    """The home's warm load driver, when one answers (it answers while it
    runs a request too)."""
    driver = read_driver(settings)
    if driver is None:
        return None
    try:
        with socket.create_connection((HOST, driver.port), timeout=5) as sock:
            _send(sock, {"token": driver.token, "ping": True})
            reply = json.loads(sock.makefile(encoding="utf-8").readline() or "{}")
    except (OSError, ValueError):
        return None
    return driver if reply.get("pong") == driver.pid else None


def delegate(
    settings: Settings,
    argv: list[str],
    start: bool = False,
    env: Mapping[str, str] | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int | None:
    """Run ``adpipe <argv>`` in the home's warm load driver (``start``: one
    is started when none runs) with ``env``'s ``ADPIPE_*`` variables; its
    output to ``out`` and ``err``. The verb's exit status, or None when no
    driver takes it (none runs, or its session settings differ): run it
    here then."""
    driver = ensure_driver(settings, env=env) if start else ping(settings)
    if driver is None:
        return None
    fingerprint = session_fingerprint(settings)
    if driver.fingerprint != fingerprint:
        log.info("the warm load driver (pid %d) has a session of other settings: running here", driver.pid)
        return None
    env = os.environ if env is None else env
    out, err = out or sys.stdout, err or sys.stderr
    request = {
        "token": driver.token,
        "fingerprint": fingerprint,
        "argv": argv,
        "env": {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)},
        "cwd": os.getcwd(),
    }
    try:
        sock = socket.create_connection((HOST, driver.port), timeout=10)
    except OSError:
        return None
    log.info("in the warm load driver (pid %d): adpipe %s", driver.pid, " ".join(argv))
    started = False
    with sock:
        sock.settimeout(None)
        _send(sock, request)
        for line in sock.makefile(encoding="utf-8"):
            message = json.loads(line)
            started = True
            if "out" in message:
                out.write(message["out"])
                out.flush()
            elif "err" in message:
                err.write(message["err"])
                err.flush()
            elif "exit" in message:
                return int(message["exit"])
            elif "refused" in message:
                log.info("the warm load driver refused the request (%s): running here", message["refused"])
                return None
    if not started:  # gone before it took the request (it exited idle): nothing ran there
        log.info("the warm load driver (pid %d) ended before it took the request: running here", driver.pid)
        return None
    log.error(
        "the warm load driver (pid %d) died before it answered (its log: %s); the next load recovers what "
        "this one left, as after a killed load",
        driver.pid, log_file(settings),
    )
    return EXIT_DRIVER_DIED


def ensure_driver(
    settings: Settings, timeout_s: float = START_TIMEOUT_S, env: Mapping[str, str] | None = None
) -> Driver | None:
    """The home's warm load driver: the one that answers, or one started
    now (detached, its log in :func:`log_file`; ``env``: its environment,
    default this process's) once it is warm. None when none became ready
    within ``timeout_s``."""
    driver = ping(settings)
    if driver is not None:
        return driver
    from adpipe.processes import start_detached

    path = log_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fault plan is a request's, never the driver's own.
    env = {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("ADPIPE_FAULT")}
    proc = start_detached([sys.executable, "-m", "adpipe", "load", "--serve"], path, env=env)
    log.info("starting a warm load driver (pid %d; its log: %s)", proc.pid, path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        driver = ping(settings)
        if driver is not None:
            return driver
        if proc.poll() is not None and not _lock_held(settings):
            log.warning("the warm load driver exited %s before it was warm (its log: %s)", proc.returncode, path)
            return None
        time.sleep(0.5)
    log.warning("no warm load driver was ready within %.0f s (its log: %s)", timeout_s, path)
    return None


def stop_driver(settings: Settings, timeout_s: float = 120.0) -> int | None:
    """SIGTERM the home's warm load driver (it finishes the request it runs,
    then exits); its pid once gone, or None when none ran."""
    driver = ping(settings)
    if driver is None:
        stale = read_driver(settings)
        if stale is not None and not _lock_held(settings):
            info_file(settings).unlink(missing_ok=True)
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(driver.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _lock_held(settings) and time.monotonic() < deadline:
        time.sleep(0.2)
    return driver.pid


def kill_driver(settings: Settings, pid: int, timeout_s: float = 30.0) -> bool:
    """SIGKILL the warm load driver ``pid`` and its Spark JVM (its process
    group) when it still serves this home, whatever it runs (a request that
    hangs never lets SIGTERM end it); True once it is gone. What it ran is
    left as a killed load leaves it: the next load recovers it."""
    driver = read_driver(settings)
    if driver is None or driver.pid != pid or not _lock_held(settings):
        return False
    log.warning("killing the warm load driver (pid %d) and its Spark JVM", pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while _lock_held(settings) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _lock_held(settings)


def _hold_lock(settings: Settings) -> int | None:
    path = _lock_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock_held(settings: Settings) -> bool:
    fd = _hold_lock(settings)
    if fd is None:
        return True
    os.close(fd)
    return False


def serve(
    settings: Settings,
    run: Callable[[list[str]], int],
    warm_up: Callable[[Settings], None] | None = None,
) -> int:
    """Be the home's warm load driver: warm up (default: the session on the
    metastore, GE's import), then run each request's ``argv`` with ``run``
    (adpipe's command line) until idle, SIGTERM or a lost session. Exit 4
    when another driver serves the home."""
    global SERVING
    lock = _hold_lock(settings)
    if lock is None:
        log.error("another warm load driver serves %s (see %s)", settings.home, info_file(settings))
        return EXIT_ANOTHER_DRIVER
    SERVING = True
    try:
        return _Server(settings, run).serve_forever(warm_up or _warm_up)
    finally:
        SERVING = False
        os.close(lock)


def _warm_up(settings: Settings) -> None:
    """What every request would otherwise pay first: the session on the
    metastore (JVM, the Hive client, Delta's classes) and GE's import."""
    from adpipe.lakehouse import quality  # noqa: F401 - imports Great Expectations: seconds
    from adpipe.lakehouse.metastore import metastore_session

    metastore_session(settings, "adpipe-load-warm").sql("SELECT 1").collect()


def _after_request() -> bool:
    """Drop what the request cached; whether the Spark session still lives."""
    from pyspark.sql import SparkSession

    spark = SparkSession._instantiatedSession  # noqa: SLF001 - pyspark's one handle on the live session
    if spark is None:
        return True  # a verb that needed none (argparse's --help)
    try:
        spark.catalog.clearCache()  # a request's cached frames never outlive it
        return not spark.sparkContext._jsc.sc().isStopped()  # noqa: SLF001
    except Exception:  # noqa: BLE001 - a dead gateway raises anything
        return False


class _Lines(io.TextIOBase):
    """A stream whose writes go to the client as ``{key: text}`` lines."""

    def __init__(self, conn: socket.socket, key: str, lock: threading.Lock) -> None:
        self.conn, self.key, self.lock = conn, key, lock

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            with self.lock, contextlib.suppress(OSError):  # a client gone: the verb goes on
                _send(self.conn, {self.key: text})
        return len(text)


class _Server:
    def __init__(self, settings: Settings, run: Callable[[list[str]], int]) -> None:
        self.settings = settings
        self.run = run
        self.token = secrets.token_hex(16)
        self.fingerprint = ""
        self.busy = threading.Lock()
        self.last_request = time.monotonic()
        self.stopping = threading.Event()
        self.base_env = dict(os.environ)

    def serve_forever(self, warm_up: Callable[[Settings], None]) -> int:
        began = time.monotonic()
        self.fingerprint = session_fingerprint(self.settings)
        warm_up(self.settings)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        with socket.create_server((HOST, 0)) as listener:
            listener.settimeout(0.5)
            me = Driver(os.getpid(), listener.getsockname()[1], self.token, self.fingerprint,
                        datetime.now(UTC).isoformat(timespec="seconds"))
            mask = os.umask(0o077)  # the token: this user's only
            try:
                write_json(info_file(self.settings), asdict(me))
            finally:
                os.umask(mask)
            log.info(
                "warm load driver ready in %.1f s: pid %d on %s:%d; exits after %d s without a request",
                time.monotonic() - began, me.pid, HOST, me.port, self.settings.load_warm_idle_s,
            )
            try:
                self._accept(listener)
            finally:
                with self.busy:  # the request being run finishes first
                    if (read_driver(self.settings) or me).pid == me.pid:
                        info_file(self.settings).unlink(missing_ok=True)
        log.info("warm load driver pid %d stopped", me.pid)
        return 0

    def _accept(self, listener: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
                self.last_request = time.monotonic()  # a request on its way is no idleness
            except TimeoutError:
                idle = time.monotonic() - self.last_request
                if not self.busy.locked() and idle > self.settings.load_warm_idle_s:
                    log.info("no request for %.0f s: exiting", idle)
                    return
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, conn.makefile(encoding="utf-8") as reader:
            try:
                request = json.loads(reader.readline() or "{}")
            except ValueError:
                return
            if not hmac.compare_digest(str(request.get("token", "")), self.token):
                _send(conn, {"refused": "wrong token"})
                return
            if request.get("ping"):
                _send(conn, {"pong": os.getpid(), "busy": self.busy.locked()})
                return
            if request.get("fingerprint") != self.fingerprint:
                _send(conn, {"refused": "a session of other settings"})
                return
            with self.busy:
                self.last_request = time.monotonic()
                _send(conn, {"started": os.getpid()})  # from here on, a lost driver is a failed command
                code = self._run(conn, request)
                self.last_request = time.monotonic()
                alive = _after_request()
            with contextlib.suppress(OSError):
                _send(conn, {"exit": code})
            if not alive:
                log.error("the Spark session is gone: exiting (the next client starts another driver)")
                self.stopping.set()

    def _run(self, conn: socket.socket, request: dict) -> int:
        argv = [str(a) for a in request.get("argv", [])]
        lock = threading.Lock()
        out, err = _Lines(conn, "out", lock), _Lines(conn, "err", lock)
        root = logging.getLogger()
        to_client = logging.StreamHandler(err)
        to_client.setFormatter(root.handlers[0].formatter if root.handlers else None)
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.clear()
        os.environ.update({k: v for k, v in self.base_env.items() if not k.startswith(ENV_PREFIX)})
        os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items() if k.startswith(ENV_PREFIX)})
        with contextlib.suppress(OSError, TypeError):
            os.chdir(request.get("cwd") or saved_cwd)
        began = time.monotonic()
        log.info("request: adpipe %s", " ".join(argv))
        root.addHandler(to_client)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = self.run(argv)
        except SystemExit as exc:  # argparse: --help, a usage error
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # noqa: BLE001 - a request never takes the driver down
            log.exception("adpipe %s failed", " ".join(argv))
            code = 1
        finally:
            root.removeHandler(to_client)
            os.environ.clear()
            os.environ.update(saved_env)
            os.chdir(saved_cwd)
        log.info("adpipe %s: exit %d in %.1f s", " ".join(argv), code, time.monotonic() - began)
        return code
