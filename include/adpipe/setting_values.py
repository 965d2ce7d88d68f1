"""How one configuration value is read and checked, for :func:`adpipe.settings.load_settings`.

Each reader takes the environment mapping and a variable's name, gives the
default when the variable is unset or empty, and raises :class:`SettingsError`
naming the variable and what it must be otherwise: integers with a floor,
TCP ports, shares, money amounts and budgets, JVM memory sizes, zoned times,
URIs, choices and broker properties. Which variables exist, and their
defaults, is ``adpipe.settings``' business: these readers never name one."""

from __future__ import annotations

import os
import re
import socket
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from adpipe.money import MoneyError, parse_micros

# host:port, one address of a comma-separated list.
HOST_PORT = re.compile(r"^[^\s:,]+:\d{1,5}$")
# A JVM memory size as Spark takes it: 512m, 2g.
JVM_MEMORY = re.compile(r"^\d+[kmgt]?$", re.IGNORECASE)


class SettingsError(ValueError):
    """A configuration value is missing or malformed."""


def spark_task_slots(master: str, cores_max: int) -> int | None:
    """How many tasks Spark runs at once on ``master``: N of ``local[N]``
    (this machine's cores for ``local[*]``), else ``cores_max`` when set;
    None when unknown (a cluster without a cap)."""
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if local is None:
        return cores_max or None
    slots = local.group(1)
    if slots == "*":
        return os.cpu_count() or 1
    return int(slots) if slots else 1


def integer(env: dict[str, str], name: str, default: int, minimum: int = 0) -> int:
    """An integer, at least ``minimum``."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not an integer") from exc
    if value < minimum:
        raise SettingsError(f"{name}={value} must be >= {minimum}")
    return value


def above(env: dict[str, str], name: str, default: int, floor: int) -> int:
    """``env[name]`` seconds, more than ``floor`` (the load run's timeout
    must leave its hour's wait, ADPIPE_LOAD_WAIT_TIMEOUT_S, time to load)."""
    value = integer(env, name, max(default, floor + 3600), 1)
    if value <= floor:
        raise SettingsError(f"{name}={value} must exceed ADPIPE_LOAD_WAIT_TIMEOUT_S={floor}")
    return value


def utc_time(env: dict[str, str], name: str, default: datetime | None) -> datetime | None:
    """An ISO-8601 time with a zone, as UTC (``default`` when unset)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not an ISO-8601 time") from exc
    if value.tzinfo is None:
        raise SettingsError(f"{name}={raw!r} needs a zone (e.g. 2026-11-22T00:00:00Z)")
    return value.astimezone(UTC)


def choice(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (the first is the default)."""
    value = env.get(name, choices[0])
    if value not in choices:
        raise SettingsError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


def share(env: dict[str, str], name: str, default: float) -> float:
    """A fraction between 0 and 1."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a number") from exc
    if not 0.0 <= value <= 1.0:
        raise SettingsError(f"{name}={raw} must be between 0 and 1")
    return value


def money(env: dict[str, str], name: str, default: str) -> int:
    """An amount in micro-units (exact decimal, at most 6 places)."""
    raw = (env.get(name) or default).strip()
    try:
        return parse_micros(raw)
    except MoneyError as exc:
        raise SettingsError(f"{name}: {exc}") from exc


def budget(env: dict[str, str], name: str, default: str) -> int | None:
    """A budget in micro-units; "none" or "unlimited": no budget."""
    if (env.get(name) or default).strip().lower() in ("none", "unlimited"):
        return None
    return money(env, name, default)


def jvm_memory(env: dict[str, str], name: str, default: str) -> str:
    """A JVM memory size as Spark takes it: ``512m``, ``2g``."""
    value = (env.get(name) or default).strip()
    if not JVM_MEMORY.match(value):
        raise SettingsError(f"{name}={value!r} must be a size such as 512m or 2g")
    return value


def port(env: dict[str, str], name: str, default: int) -> int:
    """A TCP port; 0 means: none."""
    value = integer(env, name, default)
    if value > 65535:
        raise SettingsError(f"{name}={value} is not a port (0-65535)")
    return value


def uri(env: dict[str, str], name: str) -> str:
    """A URI setting (empty: its default under ADPIPE_HOME)."""
    raw = (env.get(name) or "").strip()
    if raw and not urlparse(raw).scheme:
        raise SettingsError(f"{name}={raw!r} needs a scheme (file://, hdfs://, s3a://)")
    return raw


def connect_urls(env: dict[str, str], name: str) -> str:
    """Spark Connect servers' ``sc://host:port``, comma-separated (empty: none)."""
    raw = (env.get(name) or "").strip()
    urls = [u.strip() for u in raw.split(",") if u.strip()]
    for url in urls:
        parsed = urlparse(url)
        try:
            has_port = parsed.port is not None
        except ValueError:
            has_port = False
        if parsed.scheme != "sc" or not parsed.hostname or not has_port:
            raise SettingsError(f"{name}={raw!r}: {url!r} is not a Spark Connect server's sc://host:port")
    return ",".join(urls)


def binds_here(host: str) -> bool:
    """Whether ``host`` is an address of this host (loopback, or one of its
    interfaces'): only such an address can be bound."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return True
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
        return True
    except OSError:
        return False


def local_folder(uri: str, what: str) -> Path:
    """A ``file:`` URI (or a bare path) as a local folder; ``what`` names it in the error."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise SettingsError(f"{what} {uri} is not a local folder")
    return Path(parsed.path)


def client_networks(env: dict[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated networks as pg_hba.conf takes them: ``samenet``,
    ``samehost`` or an address or CIDR (``10.0.0.0/8``), each normalized."""
    import ipaddress

    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    found: list[str] = []
    for entry in (e.strip() for e in raw.split(",") if e.strip()):
        if entry in ("samenet", "samehost"):
            found.append(entry)
            continue
        try:
            found.append(str(ipaddress.ip_network(entry, strict=False)))
        except ValueError:
            raise SettingsError(f"{name}: {entry!r} is not samenet, samehost, an address or a CIDR") from None
    return tuple(dict.fromkeys(found))


def broker_properties(env: dict[str, str], name: str) -> tuple[str, ...]:
    """``key=value`` entries, separated by ``;`` or new lines."""
    raw = env.get(name, "")
    entries = tuple(e.strip() for e in re.split(r"[;\n]", raw) if e.strip())
    bad = [e for e in entries if not re.fullmatch(r"[A-Za-z0-9._-]+=.*", e)]
    if bad:
        raise SettingsError(f"{name}: {bad[0]!r} is not key=value")
    return entries
