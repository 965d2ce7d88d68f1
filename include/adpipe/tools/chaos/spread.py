"""The hosts of a run with ``--hosts N`` (:mod:`adpipe.tools.hosts`): N hosts
for the run's parts and a services host for its three brokers and its
PostgreSQL, which the parts reach over the network only; where each part
runs, and the faults on whole hosts (cut off, killed, and back).

The run itself (the producer, the monitor, the check) stays in the root
namespace, which reaches the services host alone. What the hosts share is
the file system outside their own ``/tmp`` and homes: the run's checkpoint
and warehouse live there, as a cluster's live on HDFS or an object store."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from pathlib import Path

from adpipe.tools import hosts

log = logging.getLogger("adpipe.tools.chaos")

KAFKA_PORT = 9092  # the services host's own ports: any is free there
PG_PORT = 5432
BROKERS = 3
SERVICES_START_S = 300.0
BROKER_COMMAND_S = 150.0

# One broker of the services host stopped or started there (its pid is the
# services host's, its pid file in that host's home).
BROKER = r"""
import signal, sys
from adpipe.local import kafka_broker
from adpipe.settings import load_settings
action, node = sys.argv[1], int(sys.argv[2])
settings = load_settings()
if action == "stop":
    print("stopped" if kafka_broker.stop_node(settings, node, signal.Signals[sys.argv[3]]) else "not running")
else:
    kafka_broker.start_node(settings, node)
    print("started")
"""


class SpreadError(RuntimeError):
    """The run's hosts could not be made or a services command failed."""


def hosts_base(run_home: Path) -> Path:
    """Where the run's hosts keep their folders: ``<run home>/hosts``
    (outside /tmp: :func:`adpipe.tools.hosts.outside_tmp`)."""
    return hosts.outside_tmp(run_home / "hosts")


def host_names(count: int) -> list[str]:
    return [f"host-{index + 1}" for index in range(count)]


def place(preferred: str | None, usable: Iterable[str], avoid: Iterable[str] = (), turn: int = 0) -> str | None:
    """The host a part starts on: among the usable hosts, those not in
    ``avoid`` (its peers' hosts: a standby away from the active driver)
    first; of those its own (``preferred``), else one in turn (``turn``
    rotates the choice). None: no host is usable."""
    usable = sorted(usable, key=lambda name: (len(name), name))
    avoid = set(avoid)
    for among in ([name for name in usable if name not in avoid], usable):
        if preferred in among:
            return preferred
        if among:
            return among[turn % len(among)]
    return None


class Spread:
    """N hosts and a services host for one run."""

    def __init__(self, base: Path, count: int) -> None:
        if count < 2:
            raise SpreadError(f"--hosts {count}: at least 2 (the standby driver runs on a host of its own)")
        self.net = hosts.Hosts(base, host_names(count))
        self.names = host_names(count)
        self.turns = 0

    # ---- making and removing

    def reach(self) -> dict[str, str]:
        """The settings that reach the services host's brokers (node 1's
        address: the others' follow from the cluster its home records) and
        PostgreSQL."""
        services = self.net.services
        return {
            "ADPIPE_KAFKA_BOOTSTRAP": f"{services.ip}:{KAFKA_PORT}",
            "ADPIPE_KAFKA_CONTROLLER_PORT": str(KAFKA_PORT + 1),
            "ADPIPE_PG_HOST": services.ip,
            "ADPIPE_PG_PORT": str(PG_PORT),
        }

    def services_env(self, base_env: dict[str, str]) -> dict[str, str]:
        """The services host's environment: its home, the addresses it
        serves, its PostgreSQL open to the hosts and the run's own process."""
        return self.net.services.env(
            {**base_env, **self.reach(), "ADPIPE_PG_CLIENTS": f"samenet,{self.net.root_address}/32"}
        )

    def up(self, base_env: dict[str, str]) -> dict[str, str]:
        """The hosts, then ``adpipe kafka up --brokers 3`` and ``adpipe pg
        up`` on the services host; returns :meth:`reach`."""
        self.net.up()
        try:
            env = self.services_env(base_env)
            for verb in (["kafka", "up", "--brokers", str(BROKERS)], ["pg", "up"]):
                done = self.net.services.run([sys.executable, "-m", "adpipe", *verb], env=env, timeout=SERVICES_START_S)
                if done.returncode != 0:
                    raise SpreadError(
                        f"adpipe {' '.join(verb)} on the services host: exit {done.returncode}\n"
                        f"{(done.stdout + done.stderr)[-3000:]}"
                    )
        except BaseException:
            self.down()
            raise
        return self.reach()

    def down(self) -> None:
        self.net.down()

    @property
    def services_home(self) -> Path:
        return self.net.services.home

    # ---- where parts run

    def usable(self) -> list[str]:
        """The hosts a part can start on now: running, not cut off."""
        return [name for name in self.names if self.running(name) and name not in self.net.cuts]

    def running(self, name: str) -> bool:
        host = self.net[name]
        return host.init is not None and host.init.poll() is None

    def host_for(self, preferred: str | None, avoid: Iterable[str] = ()) -> hosts.Host | None:
        """The host to start a part on (:func:`place`), or None."""
        self.turns += 1
        name = place(preferred, self.usable(), avoid, self.turns)
        return self.net[name] if name is not None else None

    def home_hosts(self, count: int) -> list[str]:
        """Home hosts for ``count`` parts, in turn over the hosts."""
        return [self.names[index % len(self.names)] for index in range(count)]

    # ---- faults on whole hosts

    def cut_off(self, name: str, what: str) -> None:
        self.net.cut_off(name, what)

    def heal(self, name: str) -> None:
        if name in self.net.cuts:
            self.net.heal(name)

    def kill(self, name: str) -> None:
        """Every process of the host (its init ends its PID namespace)."""
        self.net[name].kill()

    def restart(self, name: str) -> None:
        """The killed host back (empty: its parts restart as the supervisor sees fit)."""
        if not self.running(name):
            self.net.restart(name)

    # ---- the services host's brokers

    def broker(self, base_env: dict[str, str], action: str, node: int, sig: str = "SIGTERM") -> str:
        """``stop`` (with ``sig``) or ``start`` one broker on the services
        host; its answer ("stopped", "not running", "started")."""
        done = self.net.services.run(
            [sys.executable, "-c", BROKER, action, str(node), sig],
            env=self.services_env(base_env),
            timeout=BROKER_COMMAND_S,
        )
        if done.returncode != 0:
            raise SpreadError(f"broker {node} {action}: exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

