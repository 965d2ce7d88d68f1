"""The budget service across hosts (adpipe.tools.hosts): two instances, one on
each of two hosts, share the aggregates' partitions through their consumer
group on the services host's broker and write spend into the services
host's PostgreSQL. Host A is cut off from everything while records flow:
its partitions move to host B's instance (once A's session lapses), B
charges everything, and after the heal A's instance rejoins without
charging anything twice. The expected spend is computed from the records
this test wrote (``independent_spend``: Decimal arithmetic and prices of
its own), never with the service's code.

Needs root (namespaces): elsewhere it skips, loudly."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from adpipe.budget import verify as budget_verify
from adpipe.settings import load_settings

from tests.integration.budget_helpers import (
    BudgetEnv,
    as_kafka,
    assignment,
    caught_up,
    independent_spend,
    normal_records,
    wait_until,
)
from tests.integration.helpers import BROKER_ENV
from tests.integration.on_hosts import made_hosts, start_services

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]



def test_a_budget_instance_cut_off_loses_its_partitions_to_one_on_another_host_and_spend_stays_exact(
    hosts_base: Path,
) -> None:
    with made_hosts(hosts_base, ["host-a", "host-b"]) as net:
        a, b = net["host-a"], net["host-b"]
        cluster = start_services(net)
        budget = BudgetEnv(load_settings({**os.environ, **BROKER_ENV, **cluster}), hosts_base, extra_env=cluster)
        small = {"ADPIPE_BUDGET_BATCH_SIZE": "10"}
        command = [sys.executable, "-m", "adpipe", "budget"]
        on_a = a.start(command, a.directory / "budget.log", a.env(budget.env, **small))
        on_b = b.start(command, b.directory / "budget.log", b.env(budget.env, **small))

        def owns(proc, partitions: list[int]) -> bool:  # noqa: ANN001
            return (assignment(proc.log_path) or []) == partitions

        wait_until("the two instances sharing the partitions", lambda: (
            (x := assignment(on_a.log_path)) is not None and (y := assignment(on_b.log_path)) is not None
            and len(x) == len(y) == 2 and not set(x) & set(y)), timeout=120)
        first = normal_records(80)
        budget.copy(first)
        wait_until("both charging the first records", lambda: caught_up(budget), timeout=120)

        # Records keep arriving; host A is cut off from everything, its instance running on.
        second = normal_records(120)
        budget.copy(second[:40])
        net.cut_off("host-a", "everything")
        budget.copy(second[40:])
        wait_until("host B's instance owning every partition", lambda: owns(on_b, [0, 1, 2, 3]), timeout=120)
        wait_until("host B charging everything", lambda: caught_up(budget), timeout=180)
        assert on_a.poll() is None and on_b.poll() is None, on_a.log()[-3000:] + on_b.log()[-3000:]

        # The heal: A's instance finds its partitions gone, rejoins, and they are shared again.
        net.heal("host-a")
        third = normal_records(40)
        budget.copy(third)
        wait_until("the partitions shared again", lambda: (
            (x := assignment(on_a.log_path)) is not None and (y := assignment(on_b.log_path)) is not None
            and len(x) + len(y) == 4 and not set(x) & set(y) and x and y), timeout=180)
        wait_until("every record charged", lambda: caught_up(budget), timeout=120)
        time.sleep(2)  # a publish round of the pauses

        written = first + second + third
        expected = independent_spend(as_kafka(written))
        assert {k: v for k, v in budget.spend().items() if v} == {k: v for k, v in expected.items() if v}
        assert budget.query("SELECT count(*) FROM budget_ledger") == [(len(written),)]  # each record once
        report = budget_verify.check(budget.settings)
        assert report["ok"], report
        for proc in (on_a, on_b):
            assert proc.poll() is None, proc.log()[-3000:]
