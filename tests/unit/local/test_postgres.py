"""The local PostgreSQL's password file: its owner's only, and gone after initdb."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from adpipe.local import postgres
from adpipe.settings import load_settings


@pytest.mark.parametrize("initdb_fails", [False, True])
def test_initdb_reads_the_password_from_a_0600_file_that_is_removed_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, initdb_fails: bool
) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_PG_PASSWORD": "pw-0600-only"})
    data = tmp_path / "cluster" / "data"
    seen: dict[str, object] = {}

    def fake_run(cmd: list[str], what: str) -> str:
        pwfile = Path(next(a for a in cmd if a.startswith("--pwfile=")).split("=", 1)[1])
        seen["mode"] = stat.S_IMODE(pwfile.stat().st_mode)
        seen["text"] = pwfile.read_text()
        seen["pwfile"] = pwfile
        if initdb_fails:
            raise postgres.PostgresError("initdb failed")
        data.mkdir(parents=True)
        return ""

    monkeypatch.setattr(postgres, "_data_dir", lambda _settings, create=False: data)
    monkeypatch.setattr(postgres, "_run", fake_run)
    monkeypatch.setattr(postgres, "bin_dir", lambda: Path("/usr/lib/postgresql/15/bin"))
    if initdb_fails:
        with pytest.raises(postgres.PostgresError):
            postgres._initdb(settings)
    else:
        postgres._initdb(settings)
    assert seen["mode"] == 0o600 and seen["text"] == "pw-0600-only\n"
    assert not Path(str(seen["pwfile"])).exists()  # removed, even when initdb failed


def test_as_root_the_server_runs_through_runuser_found_outside_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # cron and `env -i` give root a PATH without /usr/sbin, where runuser lives.
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    (sbin / "runuser").write_text("#!/bin/sh\n")
    (sbin / "runuser").chmod(0o755)
    monkeypatch.setattr(postgres, "_SBIN_DIRS", (str(tmp_path / "absent"), str(sbin)))
    monkeypatch.setattr(postgres.os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    cmd = postgres._as_owner(["pg_ctl", "status"])
    assert cmd == [str(sbin / "runuser"), "-u", "postgres", "--", "pg_ctl", "status"]


def test_as_root_without_runuser_the_error_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres.os, "geteuid", lambda: 0)
    monkeypatch.setattr(postgres.shutil, "which", lambda *_a, **_k: None)
    with pytest.raises(postgres.PostgresError, match="runuser"):
        postgres._as_owner(["pg_ctl", "status"])
