"""Many hosts, one pipeline, on one machine (adpipe.tools.hosts): each host a
set of namespaces with its own address, hostname, /tmp and ADPIPE_HOME, the
broker on a services host the others reach over the network only, the
checkpoint on the file system they share (as a cluster shares HDFS).

The harness itself: the hosts reach each other and the services host and
nothing else, a cut and a heal do what they say, and nothing is left
behind. Then the stream job's leadership across hosts: the active driver's
host is cut off (from the brokers, or from everything) while the driver is
in a transaction; the standby on another host takes over and commits, the
cut-off driver ends itself (fenced, exit 4) and never commits again; after
the heal the counts are exact against the producer's summaries.

Needs root and iproute2/util-linux: elsewhere each test skips, loudly."""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.faults import AFTER_PRODUCE
from adpipe.stream import leadership
from adpipe.tools import hosts
from confluent_kafka import KafkaException

from tests.integration import on_hosts
from tests.integration.helpers import BROKER_ENV, assert_exactly_once, make_pipeline
from tests.integration.on_hosts import made_hosts

log = logging.getLogger("adpipe.tests.hosts")

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
PROBE_PORT = 7000
KAFKA_PORT = 9092  # each host has its own ports: any number is free there

# A host's listener: answers each connection with its hostname.
LISTEN = r"""
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
s.settimeout(1.0)
print("listening", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        conn, _ = s.accept()
    except TimeoutError:
        continue
    conn.sendall(socket.gethostname().encode())
    conn.close()
"""

# One connection from a host: the reply, or the error and how long it took.
CONNECT = r"""
import json, socket, sys, time
started = time.monotonic()
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as conn:
        print(json.dumps({"reply": conn.recv(100).decode(), "s": time.monotonic() - started}))
except OSError as exc:
    print(json.dumps({"errno": exc.errno, "error": str(exc), "s": time.monotonic() - started}))
"""


def connect(host: hosts.Host | None, address: str, timeout_s: float = 2.0) -> dict:
    """One connection to ``address``'s listener from ``host``; None: from
    this process (the root namespace), which reaches the services host only."""
    if host is None:
        started = time.monotonic()
        try:
            with socket.create_connection((address, PROBE_PORT), timeout=timeout_s) as conn:
                return {"reply": conn.recv(100).decode(), "s": time.monotonic() - started}
        except OSError as exc:
            return {"errno": exc.errno, "error": str(exc), "s": time.monotonic() - started}
    done = host.run([sys.executable, "-c", CONNECT, address, str(PROBE_PORT), str(timeout_s)], timeout=timeout_s + 30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def reaches(host: hosts.Host | None, target: hosts.Host) -> bool:
    return connect(host, target.ip).get("reply") == target.name


def cut(host: hosts.Host | None, target: hosts.Host) -> bool:
    """No answer at all: the packets vanish (a refusal would be an answer)."""
    got = connect(host, target.ip, timeout_s=1.5)
    return "reply" not in got and got.get("errno") is None and "timed out" in got["error"]


def _routes_into(subnet: ipaddress.IPv4Network) -> list[dict]:
    rows = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True,
                                     text=True, check=True).stdout or "[]")
    found = []
    for row in rows:
        dst = row.get("dst", "")
        if dst and dst != "default" and ipaddress.ip_network(dst if "/" in dst else f"{dst}/32",
                                                             strict=False).overlaps(subnet):
            found.append(row)
    return found


def test_without_root_or_its_tools_the_harness_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 1000)
    assert "needs root" in hosts.unavailable_reason()
    monkeypatch.setattr(hosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(hosts.shutil, "which", lambda tool: None if tool in ("ip", "nsenter") else f"/bin/{tool}")
    assert hosts.unavailable_reason() == "needs ip, nsenter on the PATH (iproute2, util-linux)"
    with pytest.raises(hosts.HostsUnavailable, match="needs ip, nsenter"):
        hosts.Hosts(on_hosts.hosts_root() / "never", ["host-a"]).up()
    with pytest.raises(hosts.HostsError, match="must not be under /tmp"):
        hosts.Hosts(Path("/tmp/hosts"), ["host-a"])


def test_hosts_reach_each_other_and_the_services_host_only_and_leave_nothing_behind(hosts_base: Path) -> None:
    # What a harness killed before its teardown would leave: removed at the next start.
    gone = subprocess.Popen(["true"])  # noqa: S607
    gone.wait()
    stale = f"{hosts.PREFIX}{gone.pid}x0"
    subprocess.run(["ip", "netns", "add", f"{stale}-sw"], check=True)
    subprocess.run(["ip", "link", "add", "name", stale, "type", "veth", "peer", "name", "uplink", "netns",
                    f"{stale}-sw"], check=True)

    with made_hosts(hosts_base, ["host-a", "host-b"]) as net:
        assert hosts.harness_objects(stale) == []
        a, b, services = net["host-a"], net["host-b"], net.services
        everyone = (a, b, services)
        # Each its hostname, /tmp and ADPIPE_HOME; the harness's folder (the shared file system) shared.
        for host in everyone:
            assert host.run(["hostname"]).stdout.strip() == host.name
            assert host.run(["sh", "-c", "echo $ADPIPE_HOME"]).stdout.strip() == str(host.home)
        marker = f"hosts-probe-{uuid.uuid4().hex[:8]}"
        assert a.run(["sh", "-c", f"echo from-a > /tmp/{marker}"]).returncode == 0
        assert (a.tmp / marker).exists() and not (b.tmp / marker).exists() and not (Path("/tmp") / marker).exists()
        assert b.run(["test", "-e", f"/tmp/{marker}"]).returncode == 1
        assert b.run(["cat", str(a.tmp / marker)]).stdout.strip() == "from-a"

        listeners = {h.name: h.start([sys.executable, "-c", LISTEN, str(PROBE_PORT), "300"],
                                     h.directory / "listen.log") for h in everyone}
        for name, proc in listeners.items():
            hosts.wait_until(f"{name} listening", lambda p=proc: "listening" in p.log(), 30)
        # Every host reaches every other; the test reaches the services host (its broker).
        for source in everyone:
            for target in everyone:
                if source is not target:
                    assert reaches(source, target), (source.name, target.name, connect(source, target.ip))
        assert reaches(None, services)
        # Nothing else: no default route in a host, so another address fails
        # at once, before any packet is sent (TEST-NET-3, not the harness's).
        for host in everyone:
            assert "default" not in host.run(["ip", "-4", "route"]).stdout
        outside = "203.0.113.7"
        assert not net.subnet.overlaps(ipaddress.ip_network(f"{outside}/32"))
        assert "Network is unreachable" in a.run(["ip", "route", "get", outside]).stderr
        for address in (outside, net.root_address):  # nor the test's own end of its link
            got = connect(a, address, timeout_s=5)
            assert got.get("errno") == errno.ENETUNREACH and got["s"] < 1, got
        # The hosts' mounts stay theirs; no IPv6 on their links.
        assert str(hosts_base) not in Path("/proc/self/mountinfo").read_text()
        assert "inet6" not in a.run(["ip", "addr"]).stdout + services.run(["ip", "addr"]).stdout
        assert subprocess.run(["ip", "-6", "addr", "show", "dev", net.id], capture_output=True, text=True,
                              check=True).stdout == ""
        # The root namespace routes the services host's address alone into the subnet.
        into = _routes_into(net.subnet)
        assert [(r["dst"], r.get("dev")) for r in into] == [(services.ip, net.id)], into

        net.cut_off("host-a", "services")
        assert cut(a, services) and cut(services, a)
        assert reaches(a, b) and reaches(b, services) and reaches(None, services)
        net.heal("host-a")
        assert reaches(a, services) and reaches(services, a)

        net.cut_off("host-a", "everything")
        assert cut(a, b) and cut(b, a) and cut(a, services)
        assert reaches(b, services)
        net.heal("host-a")
        hosts.wait_until("host-a back", lambda: reaches(a, b) and reaches(a, services), 20, 0.5)

        b.kill()  # every process of the host: its listener too
        assert listeners["host-b"].wait(timeout=10) == -signal.SIGKILL
        assert connect(a, b.ip).get("errno") == errno.ECONNREFUSED  # its address stays; nothing listens
        assert listeners["host-a"].poll() is None
    assert hosts.harness_objects(net.id) == []
    assert _routes_into(net.subnet) == []


# ---- the stream job's leadership across hosts


def _leader(settings) -> leadership.Driver | None:  # noqa: ANN001
    try:
        return leadership.leader(settings, timeout_s=5)
    except KafkaException:  # the group not described this time: asked again
        return None


def _wait(what: str, condition, proc: hosts.HostProcess, timeout_s: float, interval_s: float = 0.5) -> None:  # noqa: ANN001
    """``condition()`` true within ``timeout_s`` while ``proc`` runs (else the test fails with its log)."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / interval_s) + 2):
        if condition():
            return
        if proc.poll() is not None:
            pytest.fail(f"{what}: {proc.host}'s process ended first ({proc.returncode})\n{proc.log()[-5000:]}")
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s\n--- {proc.log_path.name} ---\n{proc.log()[-5000:]}")


def _batches(log_text: str) -> list[int]:
    return [int(b) for b in re.findall(r"adpipe\.stream: batch (\d+):", log_text)]


@pytest.mark.slow
# The cut from the brokers only: make test-extended (the cut from everything is make test-long's).
@pytest.mark.parametrize("what", [pytest.param("services", marks=pytest.mark.extended), "everything"])
def test_a_standby_on_another_host_takes_over_from_a_driver_cut_off_mid_transaction(
    hosts_base: Path, what: str
) -> None:
    """Host A's driver pauses itself after producing a batch into its
    transaction; its host is cut off, and it runs on. Host B's standby takes
    over once A's session expires (the group shows host-b leading), aborts
    A's transaction and commits the batch again; A finds its leadership lost
    and exits 4, before the heal, with no batch committed after the cut."""
    with made_hosts(hosts_base, ["host-a", "host-b"]) as net:
        services, a, b = net.services, net["host-a"], net["host-b"]
        kafka = {"ADPIPE_KAFKA_BOOTSTRAP": f"{services.ip}:{KAFKA_PORT}",
                 "ADPIPE_KAFKA_CONTROLLER_PORT": str(KAFKA_PORT + 1)}
        started = services.run([sys.executable, "-m", "adpipe", "kafka", "up"],
                               env=services.env({**BROKER_ENV, **kafka}), timeout=240)
        assert started.returncode == 0, started.stdout + started.stderr
        # The test's own clients in the root namespace; the checkpoint on the shared file system.
        shared = hosts_base / "shared"
        pipeline = make_pipeline(hosts_base, {**kafka, "ADPIPE_HOME": str(hosts_base / "client"),
                                              "ADPIPE_CHECKPOINT_URI": f"file://{shared / 'checkpoints'}"})
        settings = pipeline.settings
        fast = {"ADPIPE_TRIGGER_INTERVAL_S": "1"}
        stream = [sys.executable, "-m", "adpipe", "stream", "--max-offsets-per-trigger", "400"]

        def leads(proc: hosts.HostProcess, host: hosts.Host) -> bool:
            current = _leader(settings)
            return current is not None and (current.host, current.pid) == (host.name, proc.ns_pid)

        # Host A's driver commits the first windows, and stops cleanly.
        first = a.start(stream, a.directory / "stream-first.log", a.env(pipeline.env, **fast))
        _wait("host-a's driver leading", lambda: leads(first, a), first, 240)
        # Atomic: a batch of some partitions' records only would make the others' earlier events late.
        spec = {"events": 800, "minutes": 3, "duplicate_rate": 0.04, "malformed_rate": 0.02}
        s1 = pipeline.produce(atomic=True, seed=61, start=START, **spec)
        _wait("host-a committing windows", pipeline.aggregates, first, 240, 1)
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 0, first.log()[-3000:]
        # Again, to pause itself after producing its next windows into a transaction.
        pause = {"ADPIPE_FAULT": AFTER_PRODUCE, "ADPIPE_FAULT_BATCH": str(_batches(first.log())[-1] + 1),
                 "ADPIPE_FAULT_SIGNAL": "STOP"}
        active = a.start(stream, a.directory / "stream-active.log", a.env(pipeline.env, **fast, **pause))
        _wait("host-a's driver leading again", lambda: leads(active, a), active, 240)
        standby = b.start([*stream, "--standby"], b.directory / "stream-standby.log", b.env(pipeline.env, **fast))
        _wait("host-b's standby warm", lambda: leadership.STANDBY_WARM_LINE in standby.log(), standby, 240)
        assert leads(active, a)

        s2 = pipeline.produce(atomic=True, seed=62, start=START + timedelta(minutes=3), **spec)
        _wait("host-a paused mid-transaction", lambda: f"SIGSTOP at {AFTER_PRODUCE}" in active.log(), active, 240,
              0.1)
        at_cut = _batches(active.log())
        committed_by_a = _batches(first.log()) + at_cut

        net.cut_off("host-a", what)
        active.signal(signal.SIGCONT)  # it runs on, cut off, its transaction open
        cut_at = time.monotonic()
        lease_s = settings.stream_lease_s
        _wait("host-b leading", lambda: leads(standby, b), standby, lease_s + 60)
        took_over_in = time.monotonic() - cut_at
        # A's session expired on its side too: it ends itself, still cut off.
        assert active.wait(timeout=lease_s + 60) == leadership.EXIT_FENCED, active.log()[-3000:]
        assert "fenced: " in active.log()
        assert _batches(active.log()) == at_cut  # nothing committed after the cut
        _wait("host-b's first batch", lambda: "standby: took over" in standby.log(), standby, 240)
        took = re.search(r"standby: took over \((.*)\); batch (\d+) done", standby.log())
        assert took and "on host-a left the group" in took[1], standby.log()[-3000:]
        assert int(took[2]) == committed_by_a[-1] + 1  # the batch A was in, replayed by B
        assert "older instances fenced, open transaction aborted" in standby.log()
        net.heal("host-a")

        s3 = pipeline.produce(atomic=True, seed=63, start=START + timedelta(minutes=6), **spec)

        def caught_up() -> bool:
            lag = kafka_io.stream_lag(settings)
            return bool(lag) and sum(lag.values()) == 0

        _wait("host-b consuming all input", caught_up, standby, 240, 1)
        assert leads(standby, b) and active.returncode == leadership.EXIT_FENCED
        standby.signal(signal.SIGTERM)  # stopped before the check: verify reads a still job
        assert standby.wait(timeout=120) == 0, standby.log()[-3000:]

        # A's open transaction was written and aborted: hidden from read_committed.
        assert len(pipeline.aggregates("read_uncommitted")) > len(pipeline.aggregates())
        assert_exactly_once(pipeline, [s1, s2, s3], min_windows=20 * 6)
        batches = {int(r.header(S.HEADER_BATCH)) for r in pipeline.read(settings.topics.aggregates)}
        assert max(batches) > committed_by_a[-1] and min(batches) <= committed_by_a[-1]  # both committed windows
        log.info("host-a cut off from %s: host-b led %.1f s after the cut", what, took_over_in)
