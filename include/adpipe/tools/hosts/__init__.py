"""Hosts on one machine, for tests: each host a set of Linux namespaces
(network, mount, PID, UTS) with its own address, hostname, ``/tmp`` and
``ADPIPE_HOME``, joined to the others by a bridge. One of them, the services
host, runs what the others reach over the network only (the brokers).

What :class:`Hosts` makes, for a harness id ``adph<pid>x<n>`` and a /24 it
picks (``198.18.k.0/24``)::

    root namespace (the test)  198.19.k.2 ──── point-to-point veth ────┐
                                                                       │
    <id>-sw: bridge "br0"┬── <id>-services  198.18.k.1  (+ 198.19.k.1)┘
                           ├── <id>-<host 1>  198.18.k.11
                           └── <id>-<host 2>  198.18.k.12 ...

- Addresses only from the benchmarking range 198.18.0.0/15 (RFC 2544, never
  routed on the internet), a /24 that no route or address of the root
  namespace covers (a route to its services address, added first, claims
  it: a second harness gets "File exists" and takes the next). The hosts
  have no default route: any other address fails at once with "Network is
  unreachable", before a packet is sent. Nothing forwards between links.
- The root namespace (the test process: producing, reading topics,
  describing groups) reaches the services host alone, by a route to its
  address alone over the point-to-point link; of the hosts, only the
  services host has a route back (to the test's end of that link). IPv6 is
  off in every namespace and on the root's end of the link.
- Each host has one init process: PID 1 of its PID namespace, in its own
  UTS (its hostname) and mount namespace (its own folder bound on /tmp, the
  harness's hosts file on /etc/hosts; the rest of the file system is
  shared, as a cluster shares HDFS or an object store). A process started
  on a host joins those namespaces with nsenter. Killing the init kills
  every process of the host (the kernel ends a PID namespace with its init);
  the init ends itself when the harness's pipe to it closes (the test
  process died) or after a bounded lifetime.
- :meth:`Hosts.cut_off` takes a host off the network (its bridge port down:
  a pulled cable) or off the services host only (routing rules at both ends
  that drop, silently, each one's packets from the other); :meth:`Hosts.heal`
  undoes it.
- Teardown (the context manager, and atexit) kills every host and removes
  the namespaces, the bridge and the root link; a start first removes those
  of a harness whose process is gone (found by name prefix and pid).

Needs root and ``ip`` (iproute2), ``unshare``, ``nsenter`` and ``mount``
(util-linux): :func:`unavailable_reason` says what is missing. Every wait is
bounded in count and time."""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .host import (
    COMMAND_TIMEOUT_S,
    TMP,
    Host,
    HostProcess,
    HostsError,
    HostsUnavailable,
    _child_of,
    _pid_alive,
    _run,
    wait_until,
)

log = logging.getLogger("adpipe.tools.hosts")

OUTSIDE_TMP = Path("/var/tmp")  # noqa: S108 - where a folder under /tmp goes instead
PREFIX = "adph"
NAME = re.compile(rf"{PREFIX}(\d+)x(\d+)(?:-.+)?")
HOST_NAME = re.compile(r"[a-z][a-z0-9-]{0,14}")
SERVICES = "services"
HOSTS_RANGE = ipaddress.ip_network("198.18.0.0/16")  # the bridges' /24s
LINK_RANGE = ipaddress.ip_network("198.19.0.0/16")  # the root links' pairs of addresses
TOOLS = ("ip", "unshare", "nsenter", "mount")
MAX_HOSTS = 40
SUBNET_TRIES = 64
LIFETIME_S = 3 * 3600.0  # a host's init ends itself after this, whatever happens
# Routing rules: a cut's drops come before the local table (moved from 0).
CUT_PREF = 100
LOCAL_PREF = 1000

_harnesses = itertools.count()

# A host's PID 1: sets the hostname, binds its /tmp and /etc/hosts, then
# reaps orphans until the harness's pipe closes or its lifetime ends (its
# exit ends every process of the PID namespace). The folders of its fifth
# argument (the project and its Python, when they live under /tmp: a clone
# in mktemp -d) stay where they are inside the host's own /tmp.
INIT = r"""
import os, select, socket, subprocess, sys, time
name, tmp, hosts, lifetime = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
socket.sethostname(name)
for kept in filter(None, sys.argv[5].split(os.pathsep)):
    inside = os.path.join(tmp, os.path.relpath(kept, "/tmp"))
    os.makedirs(inside, exist_ok=True)
    subprocess.run(["mount", "--bind", kept, inside], check=True)
subprocess.run(["mount", "--rbind", tmp, "/tmp"], check=True)
subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
print("ready", flush=True)
deadline = time.monotonic() + lifetime
while time.monotonic() < deadline:
    if select.select([0], [], [], 1.0)[0] and not os.read(0, 512):
        break
    for _ in range(10000):
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
"""

__all__ = [
    "SERVICES",
    "Host",
    "HostProcess",
    "Hosts",
    "HostsError",
    "HostsUnavailable",
    "harness_objects",
    "outside_tmp",
    "remove_stale",
    "unavailable_reason",
    "wait_until",
]


def unavailable_reason() -> str | None:
    """Why hosts cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return "needs root: it makes network, mount, PID and UTS namespaces, veths and a bridge (CI runs as root)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on the PATH (iproute2, util-linux)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check)


def kept_under_tmp() -> list[Path]:
    """The folders every host must see where they are although they live
    under /tmp, which each host has of its own: the project (its code, its
    venv, the test home in it), the package and this Python's installation."""
    from adpipe.settings import PROJECT_ROOT

    tmp = TMP
    found: list[Path] = []
    for folder in sorted({PROJECT_ROOT.resolve(), Path(__file__).resolve().parents[2], Path(sys.prefix).resolve(),
                          Path(sys.base_prefix).resolve()}, key=lambda f: len(f.parts)):
        if tmp in folder.parents and not any(k == folder or k in folder.parents for k in found):
            found.append(folder)
    return found


def outside_tmp(folder: Path) -> Path:
    """``folder``, or, when it lies under /tmp (a clone in ``mktemp -d``), a
    folder of /var/tmp named after it: a harness's folder must be the same
    for every host, and each host has a /tmp of its own."""
    folder = folder.resolve()
    if TMP in folder.parents:
        return OUTSIDE_TMP / f"adpipe-hosts-{os.getuid()}" / re.sub(r"[^A-Za-z0-9_.-]", "_", str(folder))
    return folder


def _taken_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 route and address of the root namespace, the default route aside."""
    taken = []
    for row in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = row.get("dst", "")
        if dst and dst != "default" and ":" not in dst:
            taken.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    for link in json.loads(_ip("-j", "-4", "addr").stdout or "[]"):
        for info in link.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{info['local']}/{info.get('prefixlen', 32)}", strict=False))
    return taken


def _operstate(netns: str, device: str) -> str:
    rows = json.loads(_ip("-n", netns, "-j", "link", "show", "dev", device).stdout or "[]")
    return rows[0].get("operstate", "") if rows else ""


def _ipv4_only(netns: str) -> None:
    """IPv6 off in a new namespace before its links come up: nothing sends
    IPv6's own packets (router solicitations, DAD, MLD) to multicast
    addresses; only the harness's IPv4 addresses carry traffic."""
    script = "for f in all default; do p=/proc/sys/net/ipv6/conf/$f/disable_ipv6; [ -e $p ] && echo 1 > $p; done; true"
    _ip("netns", "exec", netns, "sh", "-c", script)


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _root_links() -> list[str]:
    return [link["ifname"] for link in json.loads(_ip("-j", "link", "show").stdout or "[]")]


def harness_objects(harness_id: str) -> list[str]:
    """The namespaces and root link of a harness that still exist."""
    ours = [n for n in _netns_names() if n == harness_id or n.startswith(f"{harness_id}-")]
    return ours + [f"link {name}" for name in _root_links() if name == harness_id]


def remove_stale() -> list[str]:
    """Remove the namespaces and root links of harnesses whose process has
    ended (a test process killed before its teardown); returns their names."""
    removed = []
    for name in _netns_names():
        match = NAME.fullmatch(name)
        if match is None or _pid_alive(int(match[1])):
            continue
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", name, check=False)
        removed.append(name)
    for name in _root_links():
        match = NAME.fullmatch(name)
        if match is not None and not _pid_alive(int(match[1])):
            _ip("link", "del", name, check=False)
            removed.append(f"link {name}")
    if removed:
        log.warning("removed what a harness that is gone left behind: %s", ", ".join(removed))
    return removed


class Hosts:
    """N hosts and a services host on one machine (see the module doc); a
    context manager: everything it made is removed on leaving."""

    def __init__(self, base: Path, names: Sequence[str], lifetime_s: float = LIFETIME_S) -> None:
        base = Path(base).resolve()
        if base == TMP or TMP in base.parents:
            raise HostsError(f"{base}: the harness's folder must not be under /tmp (each host has its own /tmp)")
        bad = [n for n in names if not HOST_NAME.fullmatch(n) or n == SERVICES]
        if bad or len(set(names)) != len(names) or not 0 < len(names) <= MAX_HOSTS:
            raise HostsError(f"host names {list(names)}: 1 to {MAX_HOSTS} distinct [a-z][a-z0-9-]{{0,14}}, "
                             f"not {SERVICES!r}")
        self.base = base
        self.names = [SERVICES, *names]
        self.id = f"{PREFIX}{os.getpid()}x{next(_harnesses)}"
        self.switch = f"{self.id}-sw"
        self.lifetime_s = lifetime_s
        self.hosts: dict[str, Host] = {}
        self.subnet: ipaddress.IPv4Network | None = None
        self.root_address: str | None = None  # the root namespace's end of its link to the services host
        self.cuts: dict[str, str] = {}
        self._made = False

    def __enter__(self) -> Hosts:
        self.up()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.down()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def services(self) -> Host:
        return self.hosts[SERVICES]

    def netns(self, name: str) -> str:
        return f"{self.id}-{name}"

    # ---- making and removing

    def up(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        remove_stale()
        self._made = True
        atexit.register(self.down)
        try:
            self._make()
        except BaseException:
            self.down()
            raise

    def _make(self) -> None:
        first = _ip("netns", "add", self.switch, check=False)
        if first.returncode != 0:  # root, yet no namespaces allowed (a container without CAP_SYS_ADMIN)
            raise HostsUnavailable(f"cannot make a network namespace: {first.stderr.strip()}")
        for name in self.names:
            _ip("netns", "add", self.netns(name))
        for netns in [self.switch, *(self.netns(name) for name in self.names)]:
            _ipv4_only(netns)
        _ip("-n", self.switch, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        self.subnet = self._claim_subnet()
        for index, name in enumerate(self.names):
            address = str(self.subnet[1] if name == SERVICES else self.subnet[10 + index])
            self.hosts[name] = self._make_host(name, address)
        hosts_file = self.base / "hosts"
        hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.name}\n" for h in self.hosts.values()))
        for host in self.hosts.values():
            self._start_init(host, hosts_file)
        for host in self.hosts.values():  # a veth's carrier shows a moment after both ends are up
            wait_until(f"host {host.name}'s link up", lambda h=host: _operstate(h.netns, "eth0") == "UP", 10, 0.05)

    def _make_host(self, name: str, address: str) -> Host:
        netns = self.netns(name)
        _ip("link", "add", "name", "eth0", "netns", netns, "type", "veth", "peer", "name", name, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", name, "master", "br0")
        _ip("-n", self.switch, "link", "set", name, "up")
        _ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        # The local table after the rules a cut adds, so that theirs drop first.
        _ip("-n", netns, "rule", "add", "pref", str(LOCAL_PREF), "lookup", "local")
        _ip("-n", netns, "rule", "del", "pref", "0")
        directory = self.base / name
        host = Host(name, netns, address, directory)
        for folder in (directory, host.home, host.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        host.tmp.chmod(0o1777)
        return host

    def _claim_subnet(self) -> ipaddress.IPv4Network:
        """A /24 for the bridge, and the root namespace's link to the
        services host: the first index k whose networks nothing in the root
        namespace covers, claimed by adding the route to 198.18.k.1."""
        services = self.netns(SERVICES)
        _ip("link", "add", "name", self.id, "type", "veth", "peer", "name", "uplink", "netns", services)
        no_ipv6 = Path(f"/proc/sys/net/ipv6/conf/{self.id}/disable_ipv6")
        if no_ipv6.exists():  # before it is up: it never sends a packet of IPv6's own (solicitations, DAD)
            no_ipv6.write_text("1\n")
        _ip("link", "set", self.id, "up")
        _ip("-n", services, "link", "set", "uplink", "up")
        start = (os.getpid() * 7 + int(self.id.rsplit("x", 1)[1])) % 256
        for step in range(SUBNET_TRIES):
            k = (start + step) % 256
            subnet = ipaddress.ip_network(f"{HOSTS_RANGE[0] + 256 * k}/24")
            root_end, services_end = LINK_RANGE[256 * k + 2], LINK_RANGE[256 * k + 1]
            link = ipaddress.ip_network(f"{services_end}/30", strict=False)
            if any(net.overlaps(subnet) or net.overlaps(link) for net in _taken_networks()):
                continue
            _ip("addr", "add", str(root_end), "peer", str(services_end), "dev", self.id)
            claimed = _ip("route", "add", f"{subnet[1]}/32", "via", str(services_end), "dev", self.id, check=False)
            if claimed.returncode != 0:  # another harness took it meanwhile
                _ip("addr", "del", str(root_end), "peer", str(services_end), "dev", self.id, check=False)
                continue
            _ip("-n", services, "addr", "add", str(services_end), "peer", str(root_end), "dev", "uplink")
            self.root_address = str(root_end)
            return subnet
        raise HostsError(f"no free /24 in {HOSTS_RANGE} after {SUBNET_TRIES} tries")

    def _start_init(self, host: Host, hosts_file: Path) -> None:
        command = [
            "ip", "netns", "exec", host.netns,
            "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "--",
            sys.executable, "-c", INIT, host.name, str(host.tmp), str(hosts_file), str(self.lifetime_s),
            os.pathsep.join(str(folder) for folder in kept_under_tmp()),
        ]
        with (host.directory / "init.log").open("ab") as err:
            host.init = subprocess.Popen(  # noqa: S603
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )
        assert host.init.stdout is not None
        ready, _, _ = select.select([host.init.stdout], [], [], COMMAND_TIMEOUT_S)
        line = host.init.stdout.readline() if ready else b""
        host.init_pid = _child_of(host.init)
        if line.strip() != b"ready" or host.init_pid is None:
            raise HostsError(f"host {host.name} did not start: see {host.directory / 'init.log'}")

    def restart(self, name: str) -> Host:
        """Start host ``name`` again after :meth:`Host.kill` (a machine
        rebooted): a new init in new UTS, mount and PID namespaces, the same
        network namespace, address and folders."""
        host = self.hosts[name]
        if host.init is not None and host.init.poll() is None:
            raise HostsError(f"host {name} still runs")
        host.processes.clear()
        self._start_init(host, self.base / "hosts")
        return host

    def down(self) -> None:
        """Kill every host, then remove the namespaces, the bridge and the
        root link (idempotent; also run at exit)."""
        if not self._made:
            return
        self._made = False
        atexit.unregister(self.down)
        for host in self.hosts.values():
            try:
                host.kill()
            except Exception as exc:  # noqa: BLE001 - the namespaces go whatever happened
                log.warning("host %s: %s", host.name, exc)
        _ip("link", "del", self.id, check=False)
        for name in [*self.names, "sw"]:
            _ip("netns", "del", self.netns(name), check=False)
        try:
            wait_until(f"harness {self.id} gone", lambda: not harness_objects(self.id), 30, 0.2)
        except HostsError:
            log.warning("harness %s: left behind: %s", self.id, ", ".join(harness_objects(self.id)))

    # ---- faults

    def cut_off(self, name: str, what: str = "everything") -> None:
        """Cut host ``name`` off from ``everything`` (its bridge port down)
        or from the ``services`` host only (each drops the other's packets)."""
        if name in self.cuts or name == SERVICES or what not in ("everything", SERVICES):
            raise HostsError(f"cannot cut {name} off from {what} (cut: {self.cuts})")
        self._links(name, what, cut=True)
        self.cuts[name] = what
        log.info("host %s cut off from %s", name, what)

    def heal(self, name: str) -> None:
        what = self.cuts.pop(name)
        self._links(name, what, cut=False)
        log.info("host %s healed (was cut off from %s)", name, what)

    def _links(self, name: str, what: str, cut: bool) -> None:
        """The cut of :meth:`cut_off` made (``cut``) or undone."""
        host = self.hosts[name]
        if what == SERVICES:
            services = self.services
            for netns, peer in ((host.netns, services.ip), (services.netns, host.ip)):
                _ip("-n", netns, "rule", "add" if cut else "del", "pref", str(CUT_PREF), "from", peer, "blackhole")
        else:
            _ip("-n", self.switch, "link", "set", name, "down" if cut else "up")

