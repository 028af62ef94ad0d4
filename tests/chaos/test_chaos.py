"""Faults under load, then the invariant checker.

Two ``switchyard-server`` replicas on a private PostgreSQL (``pgcluster``: a
primary and a synchronous streaming standby, the suite's own, never the
shared server), reached through a TCP proxy that plays the database's
Service address; protocol agents (``chaos_agent.py``, one process each,
varied documents, kinds, taints and capacities) that fail over between the
replicas; a submitter that puts tasks in through either replica, with
placements some agents satisfy and some do not (and a few that none does,
which must stay parked). While it runs, a seeded schedule SIGKILLs a replica
(and starts it again on a new port), SIGKILLs agents mid-task (and starts
them again), restarts PostgreSQL for real (fast and immediate shutdowns, in
turn), and fails it over (the primary stopped at once and its data thrown
away, the standby promoted, the proxy moved to it, a new standby made).
Then everything is left to settle and ``invariants.check`` reads the store
(on the primary of the moment) and the agents' logs. One summary line says
what was injected and what was checked.

Two of the agents are hosts of their own (``netns``): the schedule also
partitions them from the replicas (both ways, one way, shorter and longer
than the lease TTL), and one's link loses 5% of its packets and carries at
most 256 kbit/s all along.

Reduced size by default (well under two minutes); ``--full`` or
``SWITCHYARD_CHAOS_FULL=1`` for the full size (at least 50 replica kills, 200
agent kills, 5 PostgreSQL restarts, 3 failovers, 20 partitions);
``--soak MINUTES`` runs the full mix continuously for that long and prints
the totals. Assertions are on invariants
only, never on timings: a submitter that overruns its budget is stopped, and
the run is settled and checked before the test fails on it.
"""

from __future__ import annotations

import os
import dataclasses
import pathlib
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from harness import AgentProcess, AgentSpec, Cluster, FreshDatabase, PgProxy, Submitter, log
import netns
from pgcluster import PrivatePostgres
from invariants import check, psql_rows, unmet
from replicas import binary


@dataclass(frozen=True)
class Size:
    agents: int
    tasks: int
    replica_kills: int
    agent_kills: int
    pg_restarts: int
    failovers: int
    partitions: int
    pace_s: float
    hold_ms: int
    settle_s: float
    submit_budget_s: float


REDUCED = Size(agents=8, tasks=400, replica_kills=3, agent_kills=6, pg_restarts=2, failovers=1, partitions=2,
               pace_s=0.08, hold_ms=150, settle_s=45, submit_budget_s=120)
FULL = Size(agents=16, tasks=9000, replica_kills=50, agent_kills=200, pg_restarts=5, failovers=3, partitions=20,
            pace_s=0.05, hold_ms=500, settle_s=240, submit_budget_s=1200)

# Tag sets of the agents (cycled) and the required tags of tasks. `quantum`
# is on no agent: those tasks must stay parked and never be leased.
AGENT_TAGS = [
    ["linux", "docker"],
    ["linux", "gpu"],
    ["linux"],
    ["linux", "arm"],
    ["linux", "docker", "gpu"],
    ["windows"],
]
TASK_TAGS = [[], ["linux"], ["docker"], ["gpu"], ["arm"], ["windows"], ["linux", "gpu"], ["docker", "gpu"]]
PARKED_TAGS = ["quantum"]
SEED = 20240611


def fleet_spec(i: int) -> AgentSpec:
    """The i-th agent: tags cycled, 1-3 slots, 2 to 8 cores; one in four
    handles only the kind ``chaos`` (not ``chaos.batch``); one in five is
    tainted ``spot``. With the submitter's placements, about 1 task in 16
    fits no agent of 8 (1 in 27 of 16) and stays parked."""
    return AgentSpec(
        f"chaos-agent-{i}", AGENT_TAGS[i % len(AGENT_TAGS)], capacity=1 + i % 3, cores=(4, 2, 8, 8)[i % 4],
        kinds=["chaos"] if i % 4 == 2 else ["chaos", "chaos.batch"], taints=["spot"] if i % 5 == 2 else [],
    )


@pytest.fixture
def database() -> Iterator[FreshDatabase]:
    with FreshDatabase() as db:
        yield db


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(standby=True, synchronous=True)
    try:
        yield pg
    finally:
        pg.close()


def test_faults_under_load_keep_every_invariant(
    private_postgres: PrivatePostgres, full_size: bool, soak_minutes: float, tmp_path: pathlib.Path
):
    size = FULL if full_size or soak_minutes else REDUCED
    if soak_minutes:
        # The whole mix, continuously, for the time given: as many tasks as
        # the pace submits in it, faults drawn in FULL's proportions until
        # the submitter is done.
        size = dataclasses.replace(size, tasks=int(soak_minutes * 60 / size.pace_s),
                                   submit_budget_s=soak_minutes * 60 * 1.5 + 120)
    rng = random.Random(SEED)
    pg = private_postgres
    proxy = PgProxy("127.0.0.1", pg.primary.port)
    unavailable = netns.available()
    hosts: list[netns.Host] = []
    if unavailable:
        log(f"chaos: no partitions: {unavailable}")
    cluster = Cluster(proxy.url(pg.url()), tmp_path, count=2, listen="127.0.0.1:0" if unavailable else "0.0.0.0:0")
    logdir = tmp_path / "agent-logs"
    logdir.mkdir()
    specs = [fleet_spec(i) for i in range(size.agents)]
    # Killed agents come back under the same name, as a restarted machine
    # does (SWITCHYARD_CHAOS_SAME_NAME=0 restarts them as new agents).
    same_name = os.environ.get("SWITCHYARD_CHAOS_SAME_NAME", "1") == "1"
    agents = [AgentProcess(spec, cluster.addresses_file, logdir, size.hold_ms, same_name) for spec in specs]
    if not unavailable:
        # The last two agents are hosts of their own, the partitions' targets;
        # the last one's link is lossy and slow all along: 5% of its packets
        # lost each way, at most 256 kbit/s each way.
        for agent in agents[-2:]:
            agent.host = netns.Host(agent.spec.name)
            hosts.append(agent.host)
        hosts[-1].lossy(5, rate_kbit=256)
    selectors = TASK_TAGS * 10 + [PARKED_TAGS]  # 1 in 81 needs a tag no agent has
    submitter = Submitter(cluster, selectors, size.tasks, seed=SEED, pace_s=size.pace_s)
    stop = threading.Event()
    errors: list[BaseException] = []
    overran = ""
    kinds = ("replica", "agent", "pg_restart", "failover", "partition")
    planned = dict(zip(kinds, (size.replica_kills, size.agent_kills, size.pg_restarts, size.failovers,
                               0 if unavailable else size.partitions), strict=True))
    injected = dict.fromkeys(kinds, 0)
    try:
        for agent in agents:
            agent.start()

        def submit() -> None:
            try:
                submitter.run(stop)
            except BaseException as err:  # noqa: BLE001 - reported by the test
                errors.append(err)

        submitting = threading.Thread(target=submit, name="submitter")
        submitting.start()

        # The fault schedule: shuffled, spread over the submit phase; in a
        # soak, drawn one at a time for as long as the submitter runs.
        faults = [kind for kind in kinds for _ in range(planned[kind])]
        rng.shuffle(faults)
        # Each fault is due at its slot of the submit phase, however long the
        # one before took (a late one goes at once).
        spacing = size.tasks * size.pace_s / (len(faults) + 1) if not soak_minutes \
            else FULL.tasks * FULL.pace_s / (sum(planned.values()) + 1)
        due = time.monotonic()
        while not stop.is_set():
            due += spacing
            time.sleep(max(0.0, due - time.monotonic()))
            if soak_minutes:
                if not submitting.is_alive():
                    break
                fault = rng.choices(kinds, weights=[planned[k] for k in kinds])[0]
            elif faults:
                fault = faults.pop()
            else:
                break
            if fault == "replica":
                index = rng.randrange(len(cluster.replicas))
                cluster.kill(index)
                time.sleep(min(1.5, spacing / 2))
                cluster.restart(index)
            elif fault == "agent":
                # Mid-task: the agent whose newest unfinished grant is the
                # newest, waiting a moment for one if none has work in hand; a
                # kill that found it had just finished is tried again (up to
                # ten kills in all).
                for _ in range(10):
                    agent = None
                    wait_until = time.monotonic() + 2.0
                    while agent is None and time.monotonic() < wait_until:
                        newest = max(((a.newest_unfinished_grant(), i) for i, a in enumerate(agents) if a.alive()),
                                     default=(0.0, -1))
                        if newest[0]:
                            agent = agents[newest[1]]
                        else:
                            time.sleep(0.05)
                    agent = agent or agents[rng.randrange(len(agents))]
                    mid_task = agent.kill()
                    time.sleep(min(1.0, spacing / 2))
                    agent.start()
                    if mid_task:
                        break
            elif fault == "pg_restart":
                pg.restart("fast" if injected["pg_restart"] % 2 == 0 else "immediate")
            elif fault == "failover":
                # The address the servers use points nowhere while the
                # standby is promoted, then at it; a new standby follows.
                proxy.cut()
                pg.kill_primary_and_promote()
                proxy.retarget("127.0.0.1", pg.primary.port)
                pg.add_standby()
            else:
                # Both ways, then only what the host sends, then only what
                # it receives; shorter than the lease TTL (2 s), then longer.
                host = hosts[rng.randrange(len(hosts))]
                host.partition(("both", "out", "in")[injected["partition"] % 3])
                time.sleep(0.5 if injected["partition"] % 2 == 0 else 3.0)
                host.heal()
            injected[fault] += 1

        # No assertion on timings: a submitter still going when its budget
        # runs out is stopped, the run says so and is settled and checked
        # all the same; the test fails on it after the checker has spoken.
        submitting.join(timeout=size.submit_budget_s)
        if submitting.is_alive():
            stop.set()
            submitting.join()
            overran = (f"the submitter did not finish within its budget of {size.submit_budget_s:.0f} s: "
                       f"{len(submitter.submitted)} of {size.tasks} submitted")
            log(overran)

        # Settle: every replica and agent up, until no live task or lease is left
        # (or the settle time runs out; the checker then says what is stuck).
        for agent in agents:
            if not agent.alive():
                agent.start()
        shapes = [spec.shape() for spec in specs]
        parked = {s.task_id for s in submitter.submitted if all(unmet(s, shape) for shape in shapes)}
        deadline = time.monotonic() + size.settle_s
        while time.monotonic() < deadline:
            rows = psql_rows(
                pg.url(),
                "SELECT (SELECT COUNT(*) FROM tasks WHERE state IN ('leased', 'running')) + "
                "(SELECT COUNT(*) FROM leases WHERE state IN ('granted', 'active')) AS live, "
                "(SELECT COUNT(*) FROM tasks WHERE state = 'queued') AS queued",
            )
            if int(rows[0]["live"]) == 0 and int(rows[0]["queued"]) <= len(parked):
                break
            time.sleep(0.5)
    finally:
        stop.set()
        for agent in agents:
            agent.stop()
        cluster.stop()
        proxy.close()
        for host in hosts:
            host.close()

    fleet = {name: dataclasses.replace(fleet_spec(i), name=name).shape()
             for i, agent in enumerate(agents) for name in agent.names}
    report = check(
        pg.url(),
        submitter.submitted,
        {name: logdir / f"{name}.jsonl" for name in fleet},
        fleet,
    )
    partitions = (f"{injected['partition']} partitions of 2 agents in network namespaces of their own "
                  "(both ways, out, in; 0.5 s and 3 s in turn; one link losing 5% of packets and held to 256 kbit/s "
                  "throughout)"
                  if not unavailable else f"no partitions ({unavailable})")
    line = (
        f"chaos{f' (soak, {soak_minutes:g} min)' if soak_minutes else ''}: "
        f"{cluster.kills} replica kills, {sum(a.kills for a in agents)} agent kills "
        f"({sum(a.mid_task_kills for a in agents)} mid-task), "
        f"{pg.restarts} PostgreSQL restart(s) (fast and immediate in turn), {pg.failovers} failover(s) "
        f"(synchronous standby promoted), {partitions}; "
        f"{submitter.retries} submit retries; {report.summary()}"
        + (f"; {overran}" if overran else "")
    )
    print(line)
    log(line)
    for violation in report.violations[:50]:
        log(f"violation: {violation}")
    assert not report.violations, f"{len(report.violations)} violations, first: {report.violations[:10]}"
    assert not errors, f"submitter failed: {errors[0]!r}"
    assert not overran, overran
    assert len(submitter.submitted) == size.tasks
    if not soak_minutes:
        assert injected == planned


def test_the_checker_reports_dangling_references(database: FreshDatabase):
    """The store's schema has no foreign keys on leases and history (migration
    0003): the checker is what would notice a row pointing at nothing. A lease
    and an event written behind the store's back, naming a task, an agent and
    a lease that do not exist, must each be reported."""
    subprocess.run(
        [str(binary("SWITCHYARD_SERVER_BIN", "switchyard-server")), "migrate", "--database-url", database.url],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    task, agent, lease, other_lease = (str(uuid.uuid4()) for _ in range(4))
    subprocess.run(
        ["psql", database.url, "-v", "ON_ERROR_STOP=1", "-qc",
         "INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, granted_at_ms, expires_at_ms, "
         f"ended_at_ms, outcome) VALUES ('{lease}', '{task}', '{agent}', 1, 'completed', TRUE, 1, 2, 2, "
         f"'succeeded'); INSERT INTO task_events (task_id, sequence, kind, state, message, lease_id, "
         f"occurred_at_ms) VALUES ('{task}', 1, 'leased', 'leased', 'x', '{other_lease}', 1)"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    report = check(database.url, [], {}, {})
    assert sorted(v for v in report.violations if v.startswith("reference:")) == sorted([
        f"reference: lease {lease} names task {task}, which is not stored",
        f"reference: lease {lease} names agent {agent}, which is not stored",
        f"reference: a leased event names task {task}, which is not stored",
        f"reference: a leased event of task {task} names lease {other_lease}, which is not stored",
    ])
    assert "DANGLING references" in report.summary()
