"""No secret in a log or a printed line: ``adpipe demo`` run end to end with a
PostgreSQL password of its own (a random token, for a role made for it on
the session's PostgreSQL), then every file it wrote under its home, the
broker's and PostgreSQL's logs and everything it printed are searched for
that password. (The Kafka passwords of a secure broker are searched the same
way in test_secure_broker.py.) About three minutes: make test-extended."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from adpipe import pg as pg_client
from adpipe.local import postgres
from adpipe.settings import Settings, load_settings

from tests.integration.helpers import BROKER_ENV

pytestmark = [pytest.mark.slow, pytest.mark.extended]


def scram_sha_256_verifier(password: str, iterations: int = 4096) -> str:
    """What PostgreSQL stores for a password (RFC 5802/7677): the role is
    created from this, so the password itself never reaches the server (a
    statement it logged could not hold it)."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = base64.b64encode
    return f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}${b64(stored_key).decode()}:{b64(server_key).decode()}"


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_size < 64 * 2**20]


def test_a_demo_run_prints_and_logs_no_password(pg: Settings, tmp_path: Path) -> None:
    password = f"pw-{secrets.token_hex(12)}"
    role = f"demo_{uuid.uuid4().hex[:8]}"
    conn = pg_client.connect(pg, "postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE ROLE "{role}" LOGIN CREATEDB PASSWORD %s', (scram_sha_256_verifier(password),))
    finally:
        conn.close()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ADPIPE_")},
        **BROKER_ENV,
        "ADPIPE_PG_USER": role,
        "ADPIPE_PG_PASSWORD": password,
        # A metastore of its own, so a warehouse of its own: the shared
        # one holds tables the session's metastore registered.
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{role}",
        "ADPIPE_WAREHOUSE_URI": f"file://{tmp_path / 'warehouse'}",
        "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
    }
    settings = load_settings(env)
    before = {p: p.stat().st_mtime for p in _files(settings.home)}
    demo = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "adpipe", "demo", "--events", "1500"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "exactly-once HOLDS" in demo.stdout

    # What the run wrote or touched under its home (its own files, the
    # broker's logs), PostgreSQL's log, and what it printed.
    written = [p for p in _files(settings.home) if before.get(p) != p.stat().st_mtime]
    assert any(p.name == "stream-1.log" for p in written) and any(p.name == "broker.log" for p in written)
    tables = _files(settings.warehouse_dir)
    assert any(p.parent.name == "_delta_log" and "ad_minute_aggregates" in p.parts for p in tables)
    written += tables
    pg_data = postgres._data_dir(settings)
    assert pg_data is not None
    texts = {str(p): p.read_bytes().decode(errors="replace") for p in written}
    texts["postgres.log"] = (pg_data.parent / "postgres.log").read_text(errors="replace")
    texts["stdout"], texts["stderr"] = demo.stdout, demo.stderr
    assert [name for name, text in texts.items() if password in text] == []
    # The demo did use the password: its metastore database was created by the role.
    conn = pg_client.connect(pg, "postgres")
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", (settings.metastore_database,)
            )
            assert cur.fetchone() == (role,)
    finally:
        conn.close()
