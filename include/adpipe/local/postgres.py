"""The local PostgreSQL of the embedded default.

Debian's PostgreSQL server binaries (``make deps`` installs them), run as a
private cluster under ``$ADPIPE_HOME/postgres``, on loopback by default
(``ADPIPE_PG_HOST``: one address of this host, e.g. a services host's that
the other hosts reach; the networks of ``ADPIPE_PG_CLIENTS``, by default
the subnet of that address, then log in with the password, nobody else). It holds the
Hive metastore that Spark applications share, the budget service's database
and Airflow's metadata. ``initdb`` refuses to run as root, so as root the
cluster belongs to the ``postgres`` system user the Debian package creates,
and lives where that user can reach it: a home is often 0700 (and so is a
``mktemp -d`` clone), so the data directory is then under the ``postgres``
user's own home (``~postgres/adpipe-clusters/<id>``), named by an id kept in
``$ADPIPE_HOME/postgres/cluster-id``. A cluster whose home no longer names
it (the home was wiped) is stopped and removed on the next ``up``."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from adpipe import pg
from adpipe.setting_values import binds_here
from adpipe.settings import Settings

log = logging.getLogger(__name__)

# Every database the project uses; `up` creates the missing ones.
DATABASES = ("adpipe", "adpipe_budget", "adpipe_metastore", "airflow")
# The server's log, in the cluster's folder beside its data.
LOG_NAME = "postgres.log"


class PostgresError(RuntimeError):
    """The local PostgreSQL could not be found, started or reached."""


@dataclass(frozen=True)
class PostgresStatus:
    running: bool
    answering: bool
    address: str

    def describe(self) -> str:
        if self.running and self.answering:
            return f"postgres up: answering on {self.address}"
        if self.running:
            return f"postgres starting or unhealthy on {self.address}"
        return f"postgres down (no cluster of ours runs; {self.address} answering={self.answering})"


def bin_dir() -> Path:
    """The server binaries: $ADPIPE_PG_BIN, else the newest Debian install."""
    override = os.environ.get("ADPIPE_PG_BIN")
    if override:
        return Path(override)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not versions:
        found = shutil.which("initdb")
        if found:
            return Path(found).parent
        raise PostgresError("PostgreSQL server binaries not found; run `make deps` (apt-get install postgresql)")
    return versions[-1].parent


# Where util-linux installs runuser: root's PATH has them, cron's and `env -i`'s may not.
_SBIN_DIRS = ("/usr/sbin", "/sbin")


def _runuser() -> str:
    found = shutil.which("runuser", path=os.pathsep.join([os.environ.get("PATH", os.defpath), *_SBIN_DIRS]))
    if found is None:
        raise PostgresError(
            "running PostgreSQL's server as root needs util-linux's runuser, which is neither on PATH nor in "
            f"{' or '.join(_SBIN_DIRS)}; install util-linux, or run as a user other than root"
        )
    return found


def _as_owner(cmd: list[str]) -> list[str]:
    """Run as the cluster owner: ``postgres`` when we are root."""
    if os.geteuid() == 0:
        return [_runuser(), "-u", "postgres", "--", *cmd]
    return cmd


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(_as_owner(cmd), capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0:
        raise PostgresError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


CLUSTERS_DIR = "adpipe-clusters"


def _clusters_root() -> Path:
    return Path(pwd.getpwnam("postgres").pw_dir) / CLUSTERS_DIR


def _cluster_dir(settings: Settings, create: bool = False) -> Path | None:
    """The cluster's own folder (data, log): ADPIPE_HOME/postgres, or as
    root the postgres user's folder this home's cluster-id names (None: no
    cluster of ours yet and ``create`` is off)."""
    if os.geteuid() != 0 or (settings.pg_dir / "data" / "PG_VERSION").exists():
        return settings.pg_dir  # not root, or a cluster made here before (its home was reachable)
    id_file = settings.pg_dir / "cluster-id"
    if not id_file.exists():
        if not create:
            return None
        settings.pg_dir.mkdir(parents=True, exist_ok=True)
        id_file.write_text(uuid.uuid4().hex + "\n")
    folder = _clusters_root() / id_file.read_text().strip()
    if create and not folder.exists():
        folder.mkdir(parents=True)
        (folder / "owner").write_text(f"{id_file}\n")
        (folder / "owner-mount-ns").write_text(_mount_namespace() + "\n")
        _chown(folder.parent)
        _chown(folder)
    return folder


def _data_dir(settings: Settings, create: bool = False) -> Path | None:
    folder = _cluster_dir(settings, create)
    return None if folder is None else folder / "data"


def log_file(settings: Settings) -> Path | None:
    """The server's log (None: no cluster of ours yet)."""
    folder = _cluster_dir(settings)
    return None if folder is None else folder / LOG_NAME


def _mount_namespace(pid: str = "self") -> str:
    """The mount namespace of a process (``mnt:[inode]``; empty if unknown)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _mount_namespace_alive(namespace: str) -> bool:
    """Whether any process still lives in mount namespace ``namespace``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _mount_namespace(entry.name) == namespace:
            return True
    return False


def _judged_here(folder: Path) -> bool:
    """Whether this process sees the file system the cluster's home was
    made in: the same mount namespace, or a gone one (a host of
    adpipe.tools.hosts, a container, a service with a private /tmp: a home under
    its /tmp is not this process's to judge while it lives), or a cluster
    made before the namespace was recorded."""
    try:
        owner_ns = (folder / "owner-mount-ns").read_text().strip()
    except OSError:
        return True
    return not owner_ns or owner_ns == _mount_namespace() or not _mount_namespace_alive(owner_ns)


def _reap_orphans() -> None:
    """As root: stop and remove the clusters whose home was wiped (its
    cluster-id file is gone, or names another cluster), as this process
    sees the file system the home was made in (:func:`_judged_here`)."""
    root = _clusters_root()
    for folder in sorted(root.glob("*")) if root.exists() else []:
        try:
            id_file = Path((folder / "owner").read_text().strip())
            if id_file.read_text().strip() == folder.name:
                continue
        except OSError:
            pass
        if not _judged_here(folder):
            continue
        data = folder / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(  # noqa: S603
                _as_owner([str(bin_dir() / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate", "-w"]),
                capture_output=True,
                check=False,
            )
        log.info("removed the PostgreSQL cluster %s: the home that made it no longer names it", folder)
        shutil.rmtree(folder, ignore_errors=True)


def _chown(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def _initdb(settings: Settings) -> Path:
    """The data directory, initialised once."""
    data = _data_dir(settings, create=True)
    assert data is not None
    if (data / "PG_VERSION").exists():
        return data
    data.parent.mkdir(parents=True, exist_ok=True)
    _chown(data.parent)
    pwfile = data.parent / "pwfile"
    # Readable by its owner only, from the first byte (initdb reads it once;
    # it is removed right after).
    pwfile.unlink(missing_ok=True)
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(settings.pg_password + "\n")
    _chown(pwfile)
    log.info("initialising a PostgreSQL cluster in %s", data)
    try:
        _run(
            [
                str(bin_dir() / "initdb"),
                "-D",
                str(data),
                "-U",
                settings.pg_user,
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
            ],
            "initdb",
        )
    finally:
        pwfile.unlink(missing_ok=True)
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            "\n# adpipe: ADPIPE_PG_HOST only, no Unix socket (paths under ADPIPE_HOME can be too long)\n"
            f"listen_addresses = '{settings.pg_host}'\n"
            f"port = {settings.pg_port}\n"
            "unix_socket_directories = ''\n"
            "max_connections = 200\n"
            "shared_buffers = 64MB\n"
            "fsync = on\n"
        )
    return data


def answering(settings: Settings, timeout_s: int = 3) -> bool:
    proc = subprocess.run(  # noqa: S603
        [str(bin_dir() / "pg_isready"), "-h", settings.pg_host, "-p", str(settings.pg_port), "-t", str(timeout_s)],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def _running(settings: Settings) -> bool:
    data = _data_dir(settings)
    if data is None or not (data / "postmaster.pid").exists():
        return False
    proc = subprocess.run(  # noqa: S603
        _as_owner([str(bin_dir() / "pg_ctl"), "status", "-D", str(data)]), capture_output=True, check=False
    )
    return proc.returncode == 0


def status(settings: Settings) -> PostgresStatus:
    return PostgresStatus(_running(settings), answering(settings), f"{settings.pg_host}:{settings.pg_port}")


def ensure_databases(settings: Settings, names: tuple[str, ...] = DATABASES) -> list[str]:
    """Create the databases that do not exist yet (the project's, and the
    configured metastore's); return those created."""
    return pg.ensure_databases(settings, tuple(dict.fromkeys((*names, settings.metastore_database))))


# pg_hba.conf: besides initdb's loopback lines, the block adpipe rewrites at
# each start: ADPIPE_PG_CLIENTS (default samenet: the subnets of the
# server's own addresses), by password. Nothing reaches the server there
# unless ADPIPE_PG_HOST is such an address (a services host's).
CLIENTS_BEGIN = "# adpipe: ADPIPE_PG_CLIENTS, by password (rewritten at each start)"
CLIENTS_END = "# adpipe: end of ADPIPE_PG_CLIENTS"


def is_local(settings: Settings) -> bool:
    """Whether ADPIPE_PG_HOST is this host's (loopback, or an address of
    one of its interfaces: our own cluster, serving the others) rather than
    a server run by someone else (docker-compose, a managed one)."""
    return binds_here(settings.pg_host)


def _allow_clients(data: Path, networks: tuple[str, ...]) -> None:
    """The cluster's pg_hba.conf with adpipe's block of client networks set
    to ``networks`` (scram-sha-256), initdb's lines and any of the operator's
    own kept."""
    hba = data / "pg_hba.conf"
    lines = hba.read_text().splitlines()
    if CLIENTS_BEGIN in lines and CLIENTS_END in lines[lines.index(CLIENTS_BEGIN):]:
        begin = lines.index(CLIENTS_BEGIN)
        end = lines.index(CLIENTS_END, begin)
        lines = lines[:begin] + lines[end + 1:]
    block = [CLIENTS_BEGIN, *(f"host all all {network} scram-sha-256" for network in networks), CLIENTS_END]
    hba.write_text("\n".join([*lines, *block]) + "\n")


def up(settings: Settings, timeout_s: float = 60.0) -> PostgresStatus:
    """Initialise (once) and start the local cluster unless it runs; on a
    server elsewhere, only wait for it. Then create the missing databases."""
    address = f"{settings.pg_host}:{settings.pg_port}"
    if is_local(settings) and not _running(settings):
        if os.geteuid() == 0:
            _reap_orphans()
        if answering(settings, 1):
            raise PostgresError(
                f"something else already answers on {address}; stop it or point ADPIPE_PG_PORT elsewhere"
            )
        data = _initdb(settings)
        _allow_clients(data, settings.pg_clients)
        logfile = data.parent / LOG_NAME
        logfile.touch()
        _chown(logfile)
        log.info("starting PostgreSQL on %s (data %s)", address, data)
        # The address of today's settings, not the one written at initdb:
        # a home's ADPIPE_PG_PORT may change between runs.
        listen = f"-p {settings.pg_port} -c listen_addresses='{settings.pg_host}'"
        _run(
            [str(bin_dir() / "pg_ctl"), "start", "-D", str(data), "-l", str(logfile), "-w",
             "-t", str(int(timeout_s)), "-o", listen],
            f"starting PostgreSQL (see {logfile})",
        )
    deadline = time.monotonic() + timeout_s
    while not answering(settings, 2):
        if time.monotonic() > deadline:
            why = (
                f"; this home's cluster runs but elsewhere (started with another ADPIPE_PG_PORT or "
                f"ADPIPE_PG_HOST?): `adpipe pg down`, then `adpipe pg up` (log {_data_dir(settings).parent / LOG_NAME})"
                if is_local(settings) and _running(settings)
                else ""
            )
            raise PostgresError(f"PostgreSQL did not answer on {address} within {timeout_s:.0f}s{why}")
        time.sleep(0.5)
    created = ensure_databases(settings)
    if not is_local(settings):
        log.info("PostgreSQL at %s is not ours: nothing started, databases checked", address)
    if created:
        log.info("created databases: %s", ", ".join(created))
    return PostgresStatus(True, True, address)


def down(settings: Settings) -> bool:
    """Stop our cluster (fast shutdown). True if one was running."""
    if not _running(settings):
        return False
    data = _data_dir(settings)
    _run([str(bin_dir() / "pg_ctl"), "stop", "-D", str(data), "-m", "fast", "-w"], "stopping PostgreSQL")
    return True


def serve_metastore(settings: Settings) -> None:
    """The embedded default: start the local PostgreSQL the Hive metastore
    lives in, when the metastore is configured there and it is not up."""
    if settings.metastore == "postgres" and is_local(settings) and not answering(settings, 1):
        up(settings)
