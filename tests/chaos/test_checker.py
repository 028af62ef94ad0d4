"""The invariant checker catches what it claims to: a small real run (one
replica, two chaos agents, five tasks that between them use every kind of
hard constraint the suite submits) is checked clean, then copies of its
finished database are corrupted on purpose, one way each, and the checker
must name each corruption.

The run: agent ``wide`` (tags linux and docker, 2 slots, 8 cores, kinds
chaos and chaos.batch) and agent ``spot`` (tag linux, 1 slot, 2 cores, kind
chaos only, tainted spot); tasks ``retried`` (fails its first attempt,
tolerates spot), ``batch`` (kind chaos.batch, chaos.cores >= 4), ``double``
(tag docker, 2 slots), ``either`` (tag linux, tolerates spot) and
``parked`` (tag quantum, which no agent has). Only ``wide`` can run
``batch`` and ``double``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness import AgentProcess, AgentSpec, Cluster, FreshDatabase, Submitted, submit_request
from invariants import check, psql_rows
from replicas import TEST_PG, _with_db

SETTLE_S = 60


@dataclass
class FinishedRun:
    url: str  # the finished run's database, kept as a template
    tasks: dict[str, Submitted]
    fleet: dict[str, dict]
    logs: dict[str, pathlib.Path]


def _psql(url: str, sql: str) -> None:
    subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-qXc", sql], check=True, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FinishedRun]:
    workdir = tmp_path_factory.mktemp("checker")
    logdir = workdir / "agent-logs"
    logdir.mkdir()
    specs = [
        AgentSpec("wide", ["linux", "docker"], capacity=2, cores=8, kinds=["chaos", "chaos.batch"]),
        AgentSpec("spot", ["linux"], capacity=1, cores=2, kinds=["chaos"], taints=["spot"]),
    ]
    tasks = {
        "retried": Submitted("checker-retried", "", ["linux"], True, tolerations=["spot"]),
        "batch": Submitted("checker-batch", "", [], False, kind="chaos.batch",
                           requirements=[("chaos.cores", "gte", 4)]),
        "double": Submitted("checker-double", "", ["docker"], False, slots=2),
        "either": Submitted("checker-either", "", ["linux"], False, tolerations=["spot"]),
        "parked": Submitted("checker-parked", "", ["quantum"], False),
    }
    with FreshDatabase() as db:
        cluster = Cluster(db.url, workdir, count=1)
        agents = [AgentProcess(spec, cluster.addresses_file, logdir, hold_ms=50) for spec in specs]
        try:
            for agent in agents:
                agent.start()
            replica = cluster.live()[0]
            for i, task in enumerate(tasks.values()):
                task.task_id = replica.tasks.SubmitTask(submit_request(task, i, max_attempts=5), timeout=5).task.task_id
            runnable = [t.task_id for name, t in tasks.items() if name != "parked"]
            deadline = time.monotonic() + SETTLE_S
            while True:
                states = {r["id"]: r["state"] for r in psql_rows(db.url, "SELECT id, state FROM tasks")}
                if all(states.get(t) == "succeeded" for t in runnable):
                    break
                assert time.monotonic() < deadline, f"the run did not finish in {SETTLE_S} s: {states}"
                time.sleep(0.2)
        finally:
            for agent in agents:
                agent.stop()
            cluster.stop()
        yield FinishedRun(
            db.url, tasks, {spec.name: spec.shape() for spec in specs},
            {spec.name: logdir / f"{spec.name}.jsonl" for spec in specs},
        )


@pytest.fixture
def copy(finished: FinishedRun) -> Iterator[str]:
    """A copy of the finished run's database to corrupt."""
    name = f"switchyard_checker_{uuid.uuid4().hex[:12]}"
    _psql(_with_db(TEST_PG, "postgres"), f'CREATE DATABASE "{name}" TEMPLATE "{_db_name(finished.url)}"')
    try:
        yield _with_db(TEST_PG, name)
    finally:
        _psql(_with_db(TEST_PG, "postgres"), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _db_name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


def _check(finished: FinishedRun, url: str, logs: dict[str, pathlib.Path] | None = None) -> list[str]:
    return check(url, list(finished.tasks.values()), logs or finished.logs, finished.fleet).violations


def test_the_finished_run_is_clean(finished: FinishedRun):
    report = check(finished.url, list(finished.tasks.values()), finished.logs, finished.fleet)
    assert report.violations == []
    assert report.parked == 1
    leases = psql_rows(finished.url, f"SELECT COUNT(*) AS n FROM leases WHERE task_id = "
                                     f"'{finished.tasks['retried'].task_id}'")
    assert int(leases[0]["n"]) == 2, "the retried task ran twice"


def test_a_lost_task_is_flagged(finished: FinishedRun, copy: str):
    task = finished.tasks["either"].task_id
    _psql(copy, f"DELETE FROM tasks WHERE id = '{task}'")
    assert f"lost: task {task} (checker-either) was acknowledged but is not stored" in _check(finished, copy)


def test_a_task_its_winning_lease_did_not_decide_is_flagged(finished: FinishedRun, copy: str):
    task = finished.tasks["batch"].task_id
    _psql(copy, f"UPDATE tasks SET state = 'failed' WHERE id = '{task}'")
    flagged = [v for v in _check(finished, copy) if v.startswith("decided:")]
    assert len(flagged) == 1 and task in flagged[0] and "is failed although lease" in flagged[0], flagged


def test_a_result_from_the_losing_lease_is_flagged(finished: FinishedRun, copy: str):
    task = finished.tasks["retried"].task_id
    first = psql_rows(copy, f"SELECT id FROM leases WHERE task_id = '{task}' AND fencing_token = 1")[0]["id"]
    forged = json.dumps({"by": "wide", "lease": first, "token": 1})
    _psql(copy, f"UPDATE tasks SET result = '{forged}'::jsonb WHERE id = '{task}'")
    flagged = [v for v in _check(finished, copy) if v.startswith("decided:")]
    assert len(flagged) == 1 and "is not the one its winning lease" in flagged[0], flagged


def test_a_second_successful_completion_is_flagged(finished: FinishedRun, copy: str):
    task = finished.tasks["retried"].task_id
    _psql(copy, f"UPDATE leases SET outcome = 'succeeded' WHERE task_id = '{task}' AND fencing_token = 1")
    assert any(v.startswith(f"double: task {task}") for v in _check(finished, copy))


def test_slots_over_capacity_are_flagged(finished: FinishedRun, copy: str):
    _psql(copy, "UPDATE leases SET slots = 3 WHERE agent_id = (SELECT id FROM agents WHERE name = 'spot')")
    violations = _check(finished, copy)
    assert any(v.startswith("capacity: agent spot held 3 slots at once, capacity 1") for v in violations), violations


@pytest.mark.parametrize(
    ("corruption", "why"),
    [
        ("handled_kinds = '[\"chaos\"]'", "does not handle kind chaos.batch"),
        ("document = jsonb_set(document, '{chaos,cores}', '2')", "chaos.cores gte 4: has 2"),
        ("document = document || '{\"taints\": [\"gpu-only\"]}'", "tainted gpu-only"),
        ("document = jsonb_set(document, '{tags}', '[\"linux\"]')", "missing tag docker"),
        ("capacity = 1", "needs 2 slots: has 1"),
    ],
    ids=["kind", "requirement", "taint", "tag", "slots"],
)
def test_a_lease_to_an_agent_failing_any_hard_constraint_is_flagged(
    finished: FinishedRun, copy: str, corruption: str, why: str
):
    _psql(copy, f"UPDATE agents SET {corruption} WHERE name = 'wide'")
    placement = [v for v in _check(finished, copy) if v.startswith("placement:")]
    assert any("went to wide, whose stored document fails it: " + why in v for v in placement), placement


def test_a_grant_logged_against_a_document_that_fails_it_is_flagged(
    finished: FinishedRun, tmp_path: pathlib.Path
):
    """The agents' logs are checked too: a grant of ``batch`` (chaos.batch,
    cores >= 4) written into ``spot``'s log, with the document and kinds
    ``spot`` reported, is a placement violation of its own."""
    task = finished.tasks["batch"].task_id
    lease = psql_rows(finished.url, f"SELECT id, agent_id, fencing_token FROM leases WHERE task_id = '{task}'")[0]
    spot_log = tmp_path / "spot.jsonl"
    spot_log.write_text(finished.logs["spot"].read_text() + json.dumps({
        "t": 0, "pid": 0, "event": "grant", "address": "", "agent_id": lease["agent_id"], "lease": lease["id"],
        "task": task, "token": int(lease["fencing_token"]), "generation": 1, "tags": ["linux"],
        "document": finished.fleet["spot"]["document"], "kinds": ["chaos"], "holding": 1, "capacity": 1,
    }) + "\n")
    violations = _check(finished, finished.url, {**finished.logs, "spot": spot_log})
    assert [v for v in violations if v.startswith("placement:")] == [
        f"placement: lease {lease['id']} of task {task} (kind chaos.batch, chaos.cores gte 4) went to spot, "
        "which fails it as it was then: does not handle kind chaos.batch (generation 1)"
    ]
