"""The local PostgreSQL's password file: its owner's only, and gone after initdb."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from adpipe.local import postgres
from adpipe.setting_values import SettingsError
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


def test_an_address_of_this_host_is_our_own_cluster_and_its_subnet_logs_in_by_password(tmp_path: Path) -> None:
    """A services host serves the others on one of its addresses: `adpipe pg
    up` starts our own cluster there (an address bound, never probed over
    the network) and lets clients of that address's subnet in with the
    password."""

    def on(host: str) -> bool:
        return postgres.is_local(load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_PG_HOST": host}))

    assert on("127.0.0.1") and on("localhost") and on("127.0.0.2")  # loopback, all of 127/8 on Linux
    assert not on("192.0.2.1")  # TEST-NET-1: no interface of this host has it
    data = tmp_path / "data"
    data.mkdir()
    initdb_rules = "local all all scram-sha-256\nhost all all 127.0.0.1/32 scram-sha-256\n"
    (data / "pg_hba.conf").write_text(initdb_rules)

    def clients(networks: str | None) -> list[str]:
        env = {"ADPIPE_HOME": str(tmp_path), **({"ADPIPE_PG_CLIENTS": networks} if networks is not None else {})}
        postgres._allow_clients(data, load_settings(env).pg_clients)
        rules = (data / "pg_hba.conf").read_text()
        assert rules.startswith(initdb_rules)  # initdb's lines kept
        return [line for line in rules[len(initdb_rules):].splitlines() if not line.startswith("#")]

    assert clients(None) == ["host all all samenet scram-sha-256"]
    assert clients(None) == ["host all all samenet scram-sha-256"]  # a second start adds nothing
    assert clients("samenet, 10.1.2.3/8 ,198.19.0.2") == [  # the block rewritten, each network normalized
        "host all all samenet scram-sha-256", "host all all 10.0.0.0/8 scram-sha-256",
        "host all all 198.19.0.2/32 scram-sha-256"]
    with pytest.raises(SettingsError, match="ADPIPE_PG_CLIENTS: 'everyone' is not samenet"):
        load_settings({"ADPIPE_PG_CLIENTS": "samenet,everyone"})


def test_a_cluster_made_in_another_mount_namespace_is_judged_only_once_that_namespace_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root's `adpipe pg up` reaps the clusters whose home was wiped; a home
    made where /tmp is another (a host of the tests' harness, a service with
    a private /tmp) only looks wiped from here, so its cluster is left alone
    while that mount namespace lives."""
    folder = tmp_path / "cluster"
    folder.mkdir()
    assert postgres._judged_here(folder)  # made before the namespace was recorded
    (folder / "owner-mount-ns").write_text(postgres._mount_namespace() + "\n")
    assert postgres._judged_here(folder)  # made here
    (folder / "owner-mount-ns").write_text("mnt:[1]\n")  # no process lives in it
    assert postgres._judged_here(folder)
    monkeypatch.setattr(postgres, "_mount_namespace_alive", lambda namespace: namespace == "mnt:[1]")
    assert not postgres._judged_here(folder)
    assert postgres._mount_namespace().startswith("mnt:[")
