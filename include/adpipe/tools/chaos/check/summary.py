"""The run summed up: the faults per kind and their recovery times, the
verdict (PASS, SHORT or FAIL) and the table printed at the end."""

from __future__ import annotations

import math


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def summarize_faults(faults: list[dict], planned: dict[str, int] | None = None) -> dict[str, dict]:
    """Per kind: how many the schedule planned, how many were injected (a
    fault whose target was gone when it came is not), how many recovered,
    and recovery seconds p50/p99/max."""
    planned = planned or {}
    kinds: dict[str, dict] = {}
    for kind in sorted({f["kind"] for f in faults} | set(planned)):
        of_kind = [f for f in faults if f["kind"] == kind and f.get("injected", True)]
        times = [f["recovery_s"] for f in of_kind if f.get("recovery_s") is not None]
        kinds[kind] = {
            "planned": planned.get(kind, len(of_kind)),
            "injected": len(of_kind),
            "recovered": len(times),
            "recovery_p50_s": percentile(times, 0.5),
            "recovery_p99_s": percentile(times, 0.99),
            "recovery_max_s": max(times) if times else None,
        }
    return kinds


def summarize_failover(faults: list[dict]) -> dict:
    """The faults that took the active stream driver (``failover``: a
    stream_kill, a host fault on its host): how many, how many recovered,
    and the seconds to the job's next commit p50/p99/max, of those that
    found input waiting (``idle``: recovered with none, once the producer
    was done: their part ran again, no takeover was timed)."""
    taken = [f for f in faults if f.get("failover") and f.get("injected", True)]
    recovered = [f for f in taken if f.get("recovery_s") is not None]
    times = [f["recovery_s"] for f in recovered if not f.get("recovered_idle")]
    return {
        "faults": len(taken),
        "recovered": len(recovered),
        "idle": len(recovered) - len(times),
        "recovery_p50_s": percentile(times, 0.5),
        "recovery_p99_s": percentile(times, 0.99),
        "recovery_max_s": max(times) if times else None,
    }


def run_verdict(
    data_ok: dict[str, bool], faults: dict[str, dict], parts_down: list[str], stalls: int
) -> tuple[str, list[str]]:
    """``PASS``, ``SHORT`` (the output is right, but the run did not do what
    it set out to: a planned fault not injected, a part left down, a stalled
    job) or ``FAIL`` (``data_ok`` names a check that failed), and why."""
    failed = [name for name, ok in data_ok.items() if not ok]
    if failed:
        return "FAIL", [f"{name} check failed" for name in failed]
    short = [
        f"{kind}: injected {row['injected']} of {row['planned']} planned"
        for kind, row in faults.items()
        if row["injected"] < row["planned"]
    ]
    short += [f"left down: {part}" for part in parts_down]
    if stalls:
        short.append(f"the stream job stalled {stalls} time(s) and was killed")
    return ("SHORT", short) if short else ("PASS", [])


def render_table(report: dict) -> str:
    """The report as a plain-text table for the terminal and docs/operations.md."""

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"chaos run {report['run_id']} (seed {report['seed']}): {report['events']['sent_messages']} messages "
        f"({report['events']['distinct_events']} distinct valid events, {report['events']['malformed']} malformed) "
        f"on {report['brokers']} broker(s), Spark {report['spark_master']}"
        f"{', ' + str(report['hosts']) + ' hosts' if report.get('hosts') else ''}, {report['duration_s']:.0f} s",
        "",
        f"{'fault':<22}{'planned':>8}{'injected':>9}{'recovered':>10}{'p50 s':>8}{'p99 s':>8}{'max s':>8}",
    ]
    for kind, row in report["faults"].items():
        lines.append(
            f"{kind:<22}{row.get('planned', row['injected']):>8}{row['injected']:>9}{row['recovered']:>10}"
            f"{secs(row['recovery_p50_s']):>8}{secs(row['recovery_p99_s']):>8}{secs(row['recovery_max_s']):>8}"
        )
    total = sum(r["injected"] for r in report["faults"].values())
    planned = sum(r.get("planned", r["injected"]) for r in report["faults"].values())
    in_drain = sum(f.get("phase") == "drain" and f.get("injected", True) for f in report.get("fault_log", []))
    lines += [
        f"{'total':<22}{planned:>8}{total:>9}",
        *(
            [
                f"{'stream failover':<22}{'':>8}{failover['faults']:>9}{failover['recovered']:>10}"
                f"{secs(failover['recovery_p50_s']):>8}{secs(failover['recovery_p99_s']):>8}"
                f"{secs(failover['recovery_max_s']):>8}  (the faults that took the active driver{timed_note(failover)})"
            ]
            if (failover := report.get("failover"))
            else []
        ),
        *([f"(of which {in_drain} load kill(s) in the drain: no hour closed in the window)"] if in_drain else []),
        "",
        "restarts: " + ", ".join(f"{k} {v}" for k, v in sorted(report["restarts"].items())),
        f"max stream lag: {report['max_stream_lag']} records; stalled stream jobs killed: "
        f"{report['stream_stalls_killed']}; drain: {secs(report['drain_s'])} s",
        f"events: lost {report['check']['lost']}, duplicated {report['check']['duplicated']}; "
        f"{report['check']['aggregates']} aggregates, {report['check']['late_listed']} late "
        f"({report['check'].get('late_justified', '-')} justified), "
        f"{report['check']['dlq']} in the DLQ",
        f"tables: {'match Kafka' if report['tables']['ok'] else 'DO NOT match'} "
        f"({', '.join(report['tables']['hours']) or 'no hour'}); budgets: "
        f"{'exact' if report['spend']['ok'] else 'WRONG'} ({report['spend']['actual_micros']} micro-units)",
        *([airflow_line(airflow)] if (airflow := report.get("airflow")) else []),
        *(f"left down: {part}" for part in report.get("parts_down", [])),
        f"verdict: {report['verdict']}",
    ]
    return "\n".join(lines)


def airflow_line(airflow: dict) -> str:
    """The run's Airflow in a line: its load DAG runs by state, and the
    task tries per worker host (the retried ones included)."""
    runs = ", ".join(f"{n} {state}" for state, n in sorted(airflow["load_runs"].items())) or "none"
    tries = "; ".join(
        f"{host} {sum(states.values())} ({states.get('success', 0)} succeeded)"
        for host, states in airflow["task_tries_by_host"].items()
    )
    return f"airflow: load DAG runs {runs}; task tries by worker host: {tries or 'none'}"


def timed_note(failover: dict) -> str:
    """Which failovers the times are of, when some found no input waiting."""
    idle = failover.get("idle", 0)
    return f"; times of the {failover['recovered'] - idle} with input waiting" if idle else ""
