"""The local PostgreSQL from a home only its owner may enter: a 0700 home
(or a ``mktemp -d`` clone) as root, where the server runs as ``postgres``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from adpipe.local import postgres
from adpipe.settings import load_settings

from tests.conftest import PORT_BASE


@pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as another user only when we are root")
def test_a_0700_home_as_root_gets_a_cluster_the_server_can_reach_and_a_wiped_home_frees_it(tmp_path: Path) -> None:
    home = tmp_path / "home" / ".adpipe"
    home.parent.mkdir(mode=0o700)
    env = {"ADPIPE_HOME": str(home), "ADPIPE_PG_PORT": str(PORT_BASE + 7), "ADPIPE_PG_PASSWORD": "not-printed-7f3"}
    settings = load_settings(env)
    cli_env = {**os.environ, **env}
    try:
        up = subprocess.run([sys.executable, "-m", "adpipe", "pg", "up"], env=cli_env, capture_output=True, text=True)
        assert up.returncode == 0, up.stderr[-2000:]
        assert ":***@" in up.stdout and "not-printed-7f3" not in up.stdout + up.stderr  # the URL it prints is redacted
        assert postgres.status(settings).running and postgres.answering(settings)
        cluster = postgres._cluster_dir(settings)
        assert cluster is not None and home not in cluster.parents  # the postgres user cannot enter the home
        assert (cluster / "data" / "PG_VERSION").exists()
        # The home is wiped while the server runs: the next up stops and removes that cluster.
        shutil.rmtree(home)
        assert not postgres.status(settings).running
        postgres.up(settings)
        assert not cluster.exists()
        assert postgres.status(settings).running
    finally:
        postgres.down(settings)
        new = postgres._cluster_dir(settings)
        if new is not None:
            shutil.rmtree(new, ignore_errors=True)


def test_a_home_started_again_with_another_port_answers_there(tmp_path: Path) -> None:
    """ADPIPE_PG_PORT is today's, not the one the cluster was created with;
    a cluster still running on the old port gets an error that says so."""
    home = tmp_path / ".adpipe"
    first = load_settings({"ADPIPE_HOME": str(home), "ADPIPE_PG_PORT": str(PORT_BASE + 76)})
    second = load_settings({"ADPIPE_HOME": str(home), "ADPIPE_PG_PORT": str(PORT_BASE + 77)})
    try:
        postgres.up(first)
        with pytest.raises(postgres.PostgresError, match="runs but elsewhere"):
            postgres.up(second, timeout_s=3)
        postgres.down(first)
        postgres.up(second)
        assert postgres.answering(second) and not postgres.answering(first, 1)
    finally:
        postgres.down(first)
        cluster = postgres._cluster_dir(first)
        if cluster is not None:
            shutil.rmtree(cluster, ignore_errors=True)


def test_databases_created_by_several_processes_at_once_are_created_once(pg) -> None:  # noqa: ANN001
    """Two workers' warm load drivers starting on a new metastore database
    both create it: one does, the others find it made (the second used to
    fail on PostgreSQL's unique index of database names)."""
    import threading
    import uuid

    from adpipe import pg as pg_client

    name = f"adpipe_race_{uuid.uuid4().hex[:8]}"
    start, created, failed = threading.Barrier(6), [], []

    def create() -> None:
        start.wait()
        try:
            created.extend(pg_client.ensure_databases(pg, (name,)))
        except Exception as exc:  # noqa: BLE001 - what the test reports
            failed.append(repr(exc))

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert failed == [] and created == [name]
    finally:
        conn = pg_client.connect(pg, "postgres")
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.close()
