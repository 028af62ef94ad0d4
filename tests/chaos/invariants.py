"""The invariant checker: reads the store (PostgreSQL, directly, with psql)
and the agents' own logs after the settle phase and lists every violation.

What it checks, and how:

- none lost: every task id a SubmitTask returned exists, one per
  idempotency key;
- every task terminal or queued: none LEASED/RUNNING, no live lease left;
  a QUEUED task is allowed only when no agent of the fleet satisfies it
  (parked, and then it must never have been leased);
- none completed twice: at most one ``succeeded`` event and one lease
  completed with outcome ``succeeded`` per task (exactly one for a SUCCEEDED
  task), and no agent log shows two accepted success reports of one task on
  different leases;
- the winning lease decides: a task with a lease completed as succeeded is
  SUCCEEDED, and its stored result is the one that lease reported (the
  agents put their lease id and fencing token in every result);
- no agent over capacity: per agent, the slots of the leases table's
  [granted_at_ms, ended_at_ms) intervals never add up to more than the
  agent's capacity at once; and no agent log shows it holding more leases
  than its capacity;
- no concurrency key over its limit: per key, the [granted_at_ms,
  ended_at_ms) intervals of its tasks' leases never overlap more than the
  key's stored limit (ends taken ``CLOCK_SLACK_MS`` early: replicas stamp
  their own clock readings);
- no lease to an agent that failed a hard constraint, of any kind the suite
  uses (``unmet``: the kind handled, taints tolerated, required tags,
  requirements, slots within capacity): every grant an agent logged, against
  the document and kinds it had reported at that moment, and every lease in
  the store, against the agent's stored document, kinds and capacity; a task
  left queued must be one no agent of the fleet satisfies (parked);
- every attempt accounted for: each lease ended exactly one way, recorded
  with an end time and what ended it (COMPLETED by a succeeded or failed
  report, RELEASED by the agent or as an unacknowledged grant, EXPIRED); fencing tokens are 1..n per task, the task holds n; one
  ``leased`` event per lease; ``attempts`` = expired acknowledged leases +
  failed reports (a grant that expired unacknowledged is a release);
- every reference resolves: each lease names a stored task and agent, each
  history entry a stored task (and lease, if it names one). The PostgreSQL
  schema has no foreign keys on these tables (migration 0003), so this is
  where a dangling row would show.
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass, field


def psql_rows(database_url: str, sql: str) -> list[dict[str, str]]:
    out = subprocess.run(
        ["psql", database_url, "-v", "ON_ERROR_STOP=1", "-X", "--csv", "-c", sql],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return list(csv.DictReader(io.StringIO(out)))


def read_agent_log(path: pathlib.Path) -> list[dict]:
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the last line of a SIGKILLed process may be cut short
    return events


@dataclass
class Report:
    tasks: int = 0
    states: Counter = field(default_factory=Counter)
    parked: int = 0
    lost: int = 0
    double_completed: int = 0
    undecided: int = 0
    agents: int = 0
    max_concurrency: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (max, capacity)
    placement_violations: int = 0
    leases: int = 0
    expired: int = 0
    failed_reports: int = 0
    grants_logged: int = 0
    key_peaks: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (max running, limit)
    violations: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def summary(self) -> str:
        states = ", ".join(f"{n} {s}" for s, n in sorted(self.states.items()))
        over = [n for n, (m, c) in self.max_concurrency.items() if m > c]
        capacity = (
            f"max concurrency within capacity for {self.agents} agents"
            if not over
            else f"{len(over)} agents over capacity ({', '.join(over)})"
        )
        attempts = "attempts consistent" if not any(v.startswith("attempts:") for v in self.violations) \
            else "attempts INCONSISTENT"
        references = "references resolve" if not any(v.startswith("reference:") for v in self.violations) \
            else "DANGLING references"
        keys_over = [k for k, (m, limit) in self.key_peaks.items() if m > limit]
        keys = (
            f"no concurrency key over its limit ({len(self.key_peaks)} keys)"
            if not keys_over
            else f"{len(keys_over)} concurrency keys over their limit ({', '.join(keys_over)})"
        )
        return (
            f"{self.tasks} tasks: {states} ({self.parked} parked by design), {self.lost} lost, "
            f"{self.double_completed} double-completed, {self.undecided} not decided by their winning lease, {capacity}, {keys}, "
            f"{self.placement_violations} placement violations, {attempts}, {references} "
            f"({self.leases} leases: {self.expired} expired, {self.failed_reports} failed reports; "
            f"{self.grants_logged} grants in agent logs)"
        )


def lookup(document: dict, key: str) -> object:
    """The value at a dotted path of a document, or None."""
    value: object = document
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def unmet(task, shape: dict) -> str | None:  # task: harness.Submitted
    """The first hard constraint of ``task``'s placement an agent of
    ``shape`` (its ``document``, the ``kinds`` it handles, its ``capacity``)
    fails, as the server orders them; None when it satisfies them all. Only
    the forms the suite submits are known: a kind, tolerations, required
    tags, ``gte`` and ``eq`` requirements, a slot count."""
    kinds = shape.get("kinds") or ["*"]
    kind_parents = [task.kind[:i] for i, c in enumerate(task.kind) if c == "."]
    if not ("*" in kinds or task.kind in kinds or any(f"{p}.*" in kinds for p in kind_parents)):
        return f"does not handle kind {task.kind}"
    document = shape.get("document") or {}
    taints = document.get("taints", [])
    taints = [taints] if isinstance(taints, str) else [t for t in taints if isinstance(t, str)]
    for taint in taints:
        if taint not in task.tolerations:
            return f"tainted {taint}"
    tags = set(document.get("tags", []))
    for tag in task.required_tags:
        if tag not in tags:
            return f"missing tag {tag}"
    for key, op, wanted in task.requirements:
        actual = lookup(document, key)
        if op == "gte":
            holds = isinstance(actual, (int, float)) and not isinstance(actual, bool) and actual >= wanted
        elif op == "eq":
            holds = actual == wanted
        else:
            raise ValueError(f"the checker does not know the operator {op!r}")
        if not holds:
            return f"{key} {op} {wanted!r}: has {actual!r}"
    if task.slots > int(shape.get("capacity", 1)):
        return f"needs {task.slots} slots: has {shape.get('capacity')}"
    return None


#: How much earlier than stamped a lease end may have committed, against a
#: grant stamped by another replica.
CLOCK_SLACK_MS = 25


def describe(task) -> str:
    """A task's placement as the suite wrote it, for violation messages."""
    parts = [f"kind {task.kind}"] + [f"tag {t}" for t in task.required_tags]
    parts += [f"{k} {op} {v!r}" for k, op, v in task.requirements]
    parts += [f"tolerates {t}" for t in task.tolerations]
    if task.slots > 1:
        parts.append(f"{task.slots} slots")
    return ", ".join(parts)


def check(
    database_url: str,
    submitted: list,  # harness.Submitted
    agent_logs: dict[str, pathlib.Path],
    fleet: dict[str, dict],
) -> Report:
    """Every violation in the store and the agents' logs. ``fleet``: each
    agent name the run used, with its shape (see ``unmet``)."""
    report = Report()
    tasks = {r["id"]: r for r in psql_rows(
        database_url,
        "SELECT id, state, attempts, fencing_token, idempotency_key, lease_id, "
        "COALESCE(result::text, '') AS result FROM tasks")}
    leases = psql_rows(
        database_url,
        "SELECT id, task_id, agent_id, fencing_token, state, granted_at_ms, ended_at_ms, "
        "COALESCE(outcome, '') AS outcome, slots, acked FROM leases")
    events = psql_rows(database_url, "SELECT task_id, kind, lease_id FROM task_events")
    agents = {r["id"]: r for r in psql_rows(
        database_url,
        "SELECT id, name, capacity, document::text AS document, handled_kinds::text AS kinds FROM agents")}
    report.tasks = len(submitted)
    report.agents = len(agents)
    report.leases = len(leases)

    # -- none lost
    by_key = Counter(s.key for s in submitted)
    for s in submitted:
        task = tasks.get(s.task_id)
        if task is None:
            report.lost += 1
            report.fail(f"lost: task {s.task_id} ({s.key}) was acknowledged but is not stored")
        elif task["idempotency_key"] != s.key:
            report.fail(f"lost: task {s.task_id} has key {task['idempotency_key']!r}, submitted as {s.key!r}")
    for key, n in by_key.items():
        if n > 1:
            report.fail(f"lost: key {key} submitted {n} times")
    if len({s.task_id for s in submitted}) != len(submitted):
        report.fail("lost: two idempotency keys returned the same task id")

    by_id = {s.task_id: s for s in submitted}
    satisfiable = {s.task_id: any(unmet(s, shape) is None for shape in fleet.values()) for s in submitted}

    leases_by_task: dict[str, list[dict]] = defaultdict(list)
    for lease in leases:
        leases_by_task[lease["task_id"]].append(lease)
    events_by_task: dict[str, Counter] = defaultdict(Counter)
    for e in events:
        events_by_task[e["task_id"]][e["kind"]] += 1

    # -- every task terminal or queued
    for s in submitted:
        task = tasks.get(s.task_id)
        if task is None:
            continue
        report.states[task["state"]] += 1
        if task["state"] in ("leased", "running"):
            report.fail(f"state: task {s.task_id} is still {task['state']} after the settle phase")
        elif task["state"] == "queued":
            if satisfiable[s.task_id]:
                report.fail(f"state: task {s.task_id} ({describe(s)}) fits an agent of the fleet "
                            "but is still queued after the settle phase")
            else:
                report.parked += 1
                if leases_by_task.get(s.task_id):
                    report.fail(f"state: parked task {s.task_id} was leased")
    for lease in leases:
        if lease["state"] in ("granted", "active"):
            report.fail(f"state: lease {lease['id']} of task {lease['task_id']} is still {lease['state']}")

    # -- none completed twice
    for s in submitted:
        task = tasks.get(s.task_id)
        if task is None:
            continue
        succeeded_events = events_by_task[s.task_id]["succeeded"]
        succeeded_leases = [l for l in leases_by_task[s.task_id] if l["outcome"] == "succeeded"]
        if succeeded_events > 1 or len(succeeded_leases) > 1:
            report.double_completed += 1
            report.fail(f"double: task {s.task_id} has {succeeded_events} succeeded events, "
                        f"{len(succeeded_leases)} leases completed with success")
        if task["state"] == "succeeded" and (succeeded_events != 1 or len(succeeded_leases) != 1):
            report.fail(f"double: SUCCEEDED task {s.task_id} has {succeeded_events} succeeded events, "
                        f"{len(succeeded_leases)} successful leases")
    accepted_success: dict[str, set[str]] = defaultdict(set)
    logs = {name: read_agent_log(path) for name, path in agent_logs.items()}
    for name, entries in logs.items():
        for e in entries:
            if e["event"] == "report_ack" and e["kind"] == "succeeded" and e["code"] == 0:
                accepted_success[e["task"]].add(e["lease"])
    for task_id, lease_ids in accepted_success.items():
        if len(lease_ids) > 1:
            report.fail(f"double: agents' logs show task {task_id} completed on {len(lease_ids)} leases")

    # -- the winning lease decides the task's state and result
    for s in submitted:
        task = tasks.get(s.task_id)
        if task is None:
            continue
        won = [l for l in leases_by_task[s.task_id] if l["outcome"] == "succeeded"]
        if won and task["state"] != "succeeded":
            report.undecided += 1
            report.fail(f"decided: task {s.task_id} is {task['state']} although lease {won[0]['id']} "
                        "completed it successfully")
        if task["state"] != "succeeded" or len(won) != 1:
            continue
        result = json.loads(task["result"]) if task["result"] else None
        lease = won[0]
        if not isinstance(result, dict) or result.get("lease") != lease["id"] \
                or result.get("token") != int(lease["fencing_token"]):
            report.undecided += 1
            report.fail(f"decided: task {s.task_id}'s stored result {result!r} is not the one its winning lease "
                        f"{lease['id']} (token {lease['fencing_token']}) reported")

    # -- capacity, from the store's lease intervals and from the agents' logs
    per_agent: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for lease in leases:
        end = int(lease["ended_at_ms"]) if lease["ended_at_ms"] else 2**62
        per_agent[lease["agent_id"]].append((int(lease["granted_at_ms"]), end, int(lease["slots"])))
    for agent_id, agent in agents.items():
        points = []
        for start, end, slots in per_agent.get(agent_id, []):
            points.append((start, slots))
            points.append((end, -slots))
        points.sort(key=lambda p: (p[0], p[1]))  # an end at the same ms frees before the next start
        now = peak = 0
        for _, delta in points:
            now += delta
            peak = max(peak, now)
        capacity = int(agent["capacity"])
        report.max_concurrency[agent["name"]] = (peak, capacity)
        if peak > capacity:
            report.fail(f"capacity: agent {agent['name']} held {peak} slots at once, capacity {capacity}")
    for name, entries in logs.items():
        for e in entries:
            if e["event"] == "grant" and e["holding"] > e["capacity"]:
                report.fail(f"capacity: agent {name} logged holding {e['holding']} > {e['capacity']} "
                            f"(lease {e['lease']})")

    # -- concurrency keys: never more of a key's tasks holding a lease at once
    # than its limit, from the store's lease intervals. A key's grants and
    # lease ends come from different replicas, each stamping its own reading
    # of the clock a moment before its commit: an end counts as up to
    # CLOCK_SLACK_MS earlier than stamped (the store test of racing replicas
    # checks the count itself, exactly).
    limits = {r["key"]: int(r["max_running"]) for r in psql_rows(
        database_url, "SELECT key, max_running FROM concurrency_keys")}
    key_of = {s.task_id: s.concurrency_key for s in submitted if s.concurrency_key}
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for lease in leases:
        key = key_of.get(lease["task_id"])
        if key:
            end = int(lease["ended_at_ms"]) if lease["ended_at_ms"] else 2**62
            per_key[key].append((int(lease["granted_at_ms"]), end - CLOCK_SLACK_MS))
    for key in sorted(set(key_of.values())):
        points = sorted(
            [(start, 1) for start, _ in per_key[key]] + [(end, -1) for _, end in per_key[key]],
            key=lambda p: (p[0], p[1]),
        )
        now = peak = 0
        for _, delta in points:
            now += delta
            peak = max(peak, now)
        limit = limits.get(key)
        if limit is None:
            report.fail(f"limit: concurrency key {key} has no stored limit")
            continue
        report.key_peaks[key] = (peak, limit)
        if peak > limit:
            report.fail(f"limit: concurrency key {key} had {peak} tasks holding leases at once, limit {limit}")

    # -- placement: the agent's tags when the grant arrived, and its stored document
    lease_ids = {l["id"]: l for l in leases}
    for name, entries in logs.items():
        for e in entries:
            if e["event"] != "grant":
                continue
            report.grants_logged += 1
            task = by_id.get(e["task"])
            if task is None:
                report.fail(f"placement: agent {name} was granted task {e['task']}, which nobody submitted")
                continue
            shape = {"document": e.get("document") or {"tags": e["tags"]}, "kinds": e.get("kinds") or ["*"],
                     "capacity": e["capacity"]}
            why = unmet(task, shape)
            if why is not None:
                report.placement_violations += 1
                report.fail(f"placement: lease {e['lease']} of task {e['task']} ({describe(task)}) went to "
                            f"{name}, which fails it as it was then: {why} (generation {e['generation']})")
            stored = lease_ids.get(e["lease"])
            if stored is None:
                report.fail(f"attempts: agent {name} logged grant {e['lease']}, which is not in the store")
            elif stored["agent_id"] != e["agent_id"] or int(stored["fencing_token"]) != e["token"]:
                report.fail(f"attempts: grant {e['lease']} logged by {name} differs from the store")
    for lease in leases:
        agent = agents.get(lease["agent_id"])
        task = by_id.get(lease["task_id"])
        if agent is None or task is None:
            continue  # reported below as a dangling reference, or not the suite's
        shape = {"document": json.loads(agent["document"]), "kinds": json.loads(agent["kinds"]),
                 "capacity": int(agent["capacity"])}
        why = unmet(task, shape)
        if why is not None:
            report.placement_violations += 1
            report.fail(f"placement: lease {lease['id']} of task {task.task_id} ({describe(task)}) went to "
                        f"{agent['name']}, whose stored document fails it: {why}")

    # -- every reference resolves (no foreign keys on PostgreSQL: migration 0003)
    for lease in leases:
        if lease["task_id"] not in tasks:
            report.fail(f"reference: lease {lease['id']} names task {lease['task_id']}, which is not stored")
        if lease["agent_id"] not in agents:
            report.fail(f"reference: lease {lease['id']} names agent {lease['agent_id']}, which is not stored")
    for e in events:
        if e["task_id"] not in tasks:
            report.fail(f"reference: a {e['kind']} event names task {e['task_id']}, which is not stored")
        if e["lease_id"] and e["lease_id"] not in lease_ids:
            report.fail(f"reference: a {e['kind']} event of task {e['task_id']} names lease {e['lease_id']}, "
                        "which is not stored")

    # -- every attempt accounted for
    for s in submitted:
        task = tasks.get(s.task_id)
        if task is None:
            continue
        mine = leases_by_task.get(s.task_id, [])
        expired = 0
        lost = 0
        failed = 0
        for lease in mine:
            state, outcome = lease["state"], lease["outcome"]
            ok = (
                (state == "completed" and outcome in ("succeeded", "failed"))
                or (state == "released" and outcome in ("released", "unacknowledged"))
                or (state == "expired" and outcome == "expired")
            ) and bool(lease["ended_at_ms"])
            if not ok:
                report.fail(f"attempts: lease {lease['id']} ended as {state!r} with outcome {outcome!r} "
                            f"at {lease['ended_at_ms']!r}")
            # An attempt is a lease the agent acknowledged: a grant that
            # expired unacknowledged counts as a release.
            expired += state == "expired"
            lost += state == "expired" and lease["acked"] == "t"
            failed += state == "completed" and outcome == "failed"
        report.expired += expired
        report.failed_reports += failed
        tokens = sorted(int(l["fencing_token"]) for l in mine)
        if tokens != list(range(1, len(mine) + 1)) or int(task["fencing_token"]) != len(mine):
            report.fail(f"attempts: task {s.task_id} tokens {tokens}, task holds {task['fencing_token']}")
        if events_by_task[s.task_id]["leased"] != len(mine):
            report.fail(f"attempts: task {s.task_id} has {len(mine)} leases, "
                        f"{events_by_task[s.task_id]['leased']} leased events")
        if int(task["attempts"]) != lost + failed:
            report.fail(f"attempts: task {s.task_id} counts {task['attempts']} attempts; its leases show "
                        f"{lost} acknowledged and expired + {failed} failed")
    return report
