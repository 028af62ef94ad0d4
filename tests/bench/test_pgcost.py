"""`bench/pgcost` on a private PostgreSQL cluster of its own, with the debug binaries: the CPU of each
party per task in a real run, the plans made for its statements and PostgreSQL's CPU charged to them
(pg_stat_kcache, which `.ci/run` installs), PostgreSQL's CPU per task for five shapes in plain SQL
(`--shapes`) with the share of task rows updated in place, a preload in calls of a thousand tasks run whole
(the submitters fitted under the server's cap of tasks waiting), the notifications a second replica
brings, idle or with a watcher, and its CPU apart (`--peer`, `--peer-watching`), and a clear refusal of a batch or count below 1."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
SERVER = os.environ.get("SWITCHYARD_SERVER_BIN", str(TARGET / "debug" / "switchyard-server"))
BENCH = os.environ.get("SWITCHYARD_BENCH_BIN", str(TARGET / "debug" / "switchyard-bench"))
PGCOST = str(ROOT / "bench" / "pgcost")


def pgcost(*args: str) -> dict:
    """Runs pgcost with `args`, and answers the figures it wrote as JSON."""
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "figures.json")
        run = subprocess.run([PGCOST, "--server-bin", SERVER, "--bench-bin", BENCH, "--json", out, *args],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        with open(out) as f:
            return json.load(f)


def test_a_run_counts_the_cpu_of_each_party_per_task():
    figures = pgcost("--tasks", "300", "--capacity", "2")
    assert figures["completions"] == 300
    cpu = figures["cpu_us_per_task"]
    assert set(cpu) == {"postgresql", "server", "rest"}
    assert cpu["postgresql"] > 0 and cpu["server"] > 0 and cpu["rest"] >= 0
    statements = figures["statements"]
    assert all(0 <= s["plans_per_task"] for s in statements), statements
    assert sum(s["plans_per_task"] for s in statements) > 0, statements
    assert "postgresql_cpu_us_per_task_by_statement" in figures, (
        "no CPU by statement: install pg_stat_kcache for this PostgreSQL "
        "(Debian: postgresql-15-pg-stat-kcache; .ci/run does)")
    by_statement = figures["postgresql_cpu_us_per_task_by_statement"]
    assert all(s["us_per_task"] >= s["planning_us_per_task"] >= 0 for s in by_statement), by_statement
    # Every task is submitted through the submit function.
    assert any("switchyard_submit_tasks" in s["query"] for s in by_statement), by_statement
    in_statements = sum(s["us_per_task"] for s in by_statement)
    assert 0 < in_statements <= cpu["postgresql"], (in_statements, cpu)


def test_a_preload_a_thousand_a_call_completes_every_task():
    # From the bench's 32 submitters, a thousand a call put all eight calls in flight at once, past
    # the server's cap of 2,048 tasks waiting: the calls past it were pushed back (6,000 of 8,000
    # ran here), and the figures of those that ran were divided by all 8,000.
    figures = pgcost("--tasks", "8000", "--submit-batch", "1000")
    assert figures["completions"] == 8000
    submit = [s for s in figures["postgresql_cpu_us_per_task_by_statement"]
              if "switchyard_submit_tasks" in s["query"]]
    assert submit and submit[0]["us_per_task"] > 0, figures


def test_shapes_measure_each_phase_of_both_shapes_without_a_server():
    figures = pgcost("--shapes", "--tasks", "400", "--shape-batch", "100")
    assert list(figures) == ["switchyard", "live-leases", "hot-task", "hot-lease", "minimal"]
    hot = {shape: measured.pop("tasks_updates_hot") for shape, measured in figures.items()}
    for shape, phases in figures.items():
        assert list(phases) == ["submit", "grant", "settle"], shape
        assert all(p["tasks_per_sec"] > 0 and p["cpu_us_per_task"] >= 0 for p in phases.values()), shape
        assert sum(p["cpu_us_per_task"] for p in phases.values()) > 0, shape
    # Switchyard's schema reads `state` in its indexes' predicates, so no update of a task row is HOT;
    # the shapes whose indexes of `tasks` do not, with room on its pages, update it in place.
    assert hot["switchyard"] == 0 and hot["live-leases"] == 0, hot
    assert all(hot[shape] > 0 for shape in ("hot-task", "hot-lease", "minimal")), hot


def test_a_batch_or_count_below_one_is_refused_by_name():
    for flag in ("--shape-batch", "--tasks"):
        run = subprocess.run([PGCOST, "--shapes", flag, "0"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, run.stdout + run.stderr
        assert f"argument {flag}: 0 is less than 1" in run.stderr
        assert "Traceback" not in run.stderr


def test_a_peer_replica_is_notified_what_it_reads_and_an_idle_one_nothing():
    # Alone on its database a replica notifies nobody, and beside a replica that reads nothing (no
    # agent, no watcher) it notifies nobody either; a task's changes reach the peer while a watcher
    # on it follows them. The peer's CPU is counted apart from the rest.
    alone = pgcost("--tasks", "300", "--capacity", "2", "--live")
    assert alone["notifications_per_task"] == 0, alone["statements"]
    assert "peer" not in alone["cpu_us_per_task"]
    idle = pgcost("--tasks", "300", "--capacity", "2", "--live", "--peer")
    assert idle["completions"] == 300
    # Tasks that waited in the queue, the 50 agents' changes (registered, connected, gone), the
    # leases and their ends: none of it is read on the idle peer, so none is notified. What is:
    # the loaded replica's greeting as its first agent connects, and the peer's answer.
    assert idle["notifications_per_task"] * idle["tasks"] <= 2, idle["statements"]
    cpu = idle["cpu_us_per_task"]
    assert set(cpu) == {"postgresql", "server", "rest", "peer"}
    assert cpu["peer"] > 0, cpu
    watching = pgcost("--tasks", "300", "--capacity", "2", "--live", "--peer-watching")
    assert watching["completions"] == 300
    # Each task is at least leased and settled: two changes the watching peer hears of.
    assert watching["notifications_per_task"] >= 2, watching["statements"]
    assert watching["cpu_us_per_task"]["peer"] > 0


def test_a_peer_replica_serves_half_the_fleet():
    # `--peer-agents`: half the fleet's agents connect to the peer (the bench's `--fleet-also`; it
    # fails if the peer does not welcome them), and every task is completed; both replicas then
    # read the dispatcher's events, so what one queues is notified to the other.
    both = pgcost("--tasks", "300", "--capacity", "2", "--live", "--peer-agents")
    assert both["completions"] == 300
    assert both["cpu_us_per_task"]["peer"] > 0
    assert both["notifications_per_task"] > 0, both["statements"]

