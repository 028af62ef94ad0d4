//! PostgreSQL's grant: the tasks locked (`SKIP LOCKED`), the agents
//! locked in id order, the claims of more than slots checked against what
//! their requesters saw held, and one statement that keeps the grants
//! their free slots allow, confirms that no live lease holds what the
//! requesters did not see, and writes leases, tasks and history. Claims it
//! cannot confirm are checked again against the live leases themselves.
//! Runs on the connections of the batch paths (`super::warm`); the tasks'
//! lock makes the statements after it run on kept plans
//! (`super::KEEP_PLANS`).

use std::collections::{HashMap, HashSet};

use const_format::concatcp;
use serde_json::Value;
use sqlx::Postgres;
use sqlx::types::Json;
use switchyard_core::resources::Claim;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{GrantOutcome, GrantRefusal, GrantRequest, StoreEvent, TaskState};
use crate::store::plan::{
    AgentResources, GrantableTask, PlannedGrant, agent_resources, db, plan_grants,
};
use crate::store::sql::{Write, leases, limits, rows};

/// Locks agent rows to grant to them, in id order (every grant and submit
/// locks them so, and concurrent ones queue instead of deadlocking);
/// answers the ids of those that exist.
const LOCK_AGENTS: &str = "SELECT id FROM agents WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// The requested tasks, locked, by id alone: with `state = 'queued'` in the
/// condition the planner may read the rows through the queue's partial
/// index (it does whenever its statistics undercount the queue, as after a
/// burst of submits) and filter the whole queue by id. The state is
/// checked in `plan_grants`. The rest of the grant runs on kept plans
/// ([`super::KEEP_PLANS`]).
pub(super) const LOCK_TASKS_TO_GRANT: &str = concatcp!(
    "SELECT t.id, t.state, t.not_before_ms, t.fencing_token, \
  t.lease_ttl_ms, t.namespace, t.concurrency_key, t.priority, \
  CASE WHEN t.fairness_key IS NULL THEN NULL ELSE t.created_at_ms + t.fair_offset END AS fair_rank \
  FROM tasks t WHERE t.id = ANY($1) AND ",
    super::KEEP_PLANS,
    " FOR UPDATE OF t SKIP LOCKED"
);

/// The grants of a batch that fit their agents' free slots, written: the
/// leases, the tasks LEASED, one history entry each (numbered as
/// `history::NEXT_SEQUENCE` numbers). A grant with a claim beyond slots
/// fits only if the agent's live leases hold nothing its requester did not
/// see (`$9..$11`: agent, task and claim text of each lease seen): those it
/// cannot confirm so are answered apart, to be checked against the leases
/// themselves. Answers the task ids that fit, those leased (the same, with
/// the tasks locked) and those unconfirmed. A task is updated only if its
/// fencing token is still the one the grant was planned on.
pub(super) const GRANT_LEASES: &str = "\
WITH g AS ( \
  SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::int8[], $5::int8[], $7::int8[], \
  $8::text[]) WITH ORDINALITY AS g(lease_id, task_id, agent_id, token, expires_at_ms, slots, \
  claim, ord) \
), seen AS ( \
  SELECT * FROM UNNEST($9::uuid[], $10::uuid[], $11::text[]) AS s(agent_id, task_id, claim) \
), live AS ( \
  SELECT l.agent_id, SUM(l.slots) AS n, \
  COUNT(*) FILTER (WHERE l.claim IS NOT NULL AND s.task_id IS NULL) AS unseen FROM leases l \
  LEFT JOIN seen s ON s.agent_id = l.agent_id AND s.task_id = l.task_id AND s.claim = l.claim \
  WHERE l.agent_id = ANY($3) AND l.state IN ('granted', 'active') GROUP BY l.agent_id \
), checked AS ( \
  SELECT r.*, COALESCE(live.n, 0) + r.rn <= a.capacity AS room, \
  r.claim IS NULL OR COALESCE(live.unseen, 0) = 0 AS confirmed FROM ( \
    SELECT g.*, SUM(g.slots) OVER (PARTITION BY g.agent_id ORDER BY g.ord) AS rn FROM g \
  ) r JOIN agents a ON a.id = r.agent_id LEFT JOIN live ON live.agent_id = r.agent_id \
), fit AS ( \
  SELECT * FROM checked WHERE room AND confirmed \
), new_leases AS ( \
  INSERT INTO leases (id, task_id, agent_id, fencing_token, state, acked, granted_at_ms, \
  expires_at_ms, slots, claim) \
  SELECT lease_id, task_id, agent_id, token, 'granted', FALSE, $6, expires_at_ms, slots, claim \
  FROM fit \
), leased AS ( \
  UPDATE tasks t SET state = 'leased', fencing_token = fit.token, lease_id = fit.lease_id, \
  agent_id = fit.agent_id, progress = NULL, updated_at_ms = $6 FROM fit \
  WHERE t.id = fit.task_id AND t.fencing_token + 1 = fit.token RETURNING t.id \
), history AS ( \
  INSERT INTO task_events (task_id, sequence, kind, state, message, agent_id, lease_id, \
  occurred_at_ms) \
  SELECT fit.task_id, COALESCE((SELECT MAX(e.sequence) FROM task_events e \
  WHERE e.task_id = fit.task_id), 1) + 1, 'leased', 'leased', \
  'leased to agent ' || fit.agent_id::text || ' with fencing token ' || fit.token::text, \
  fit.agent_id, fit.lease_id, $6 FROM fit \
) \
SELECT ARRAY(SELECT task_id FROM fit), ARRAY(SELECT id FROM leased), \
ARRAY(SELECT task_id FROM checked WHERE NOT confirmed)";

/// Grants in `w` (see `LeaseStore::grant_leases`), in three statements: the
/// requested tasks are locked (`SKIP LOCKED`: one another transaction is
/// changing is refused), then the agents (in id order, as every grant and
/// submit locks them, so concurrent grants queue instead of deadlocking),
/// and then one statement counts the agents' live leases, keeps the grants
/// that fit their capacity, and writes leases, tasks and history. The count
/// is a statement after the agent locks, so it sees every grant committed
/// before this one; the agents stay locked only for that statement and the
/// commit.
///
/// A claim of more than slots is checked against what its requester saw
/// the agent's other leases hold (`GrantRequest::seen`), and the writing
/// statement confirms that no live lease holds anything that leaves out.
/// Only claims refused or unconfirmed so are checked again, against the
/// agents' sections and leases read after the locks (and after this
/// batch's first grants, as `leases::claimed_resources` reads them for
/// SQLite, in two statements), and written in one more.
pub(super) async fn grant(
    w: &mut Write<Postgres>,
    requests: &[GrantRequest],
    max_running_per_namespace: u64,
    now_ms: i64,
) -> Result<Vec<GrantOutcome>> {
    let task_ids: Vec<Uuid> = requests.iter().map(|r| r.task_id).collect();
    let task_rows = sqlx::query(LOCK_TASKS_TO_GRANT)
        .bind(&task_ids)
        .fetch_all(w.conn())
        .await
        .map_err(db("locking tasks to grant"))?;
    let mut tasks: HashMap<Uuid, GrantableTask> = HashMap::with_capacity(task_rows.len());
    for row in &task_rows {
        let id = sqlx::Row::try_get(row, "id").map_err(db("reading a task to grant"))?;
        tasks.insert(id, leases::grantable_task::<Postgres>(row)?);
    }
    let mut agent_ids: Vec<Uuid> = requests
        .iter()
        .filter(|r| tasks.contains_key(&r.task_id))
        .map(|r| r.agent_id)
        .collect();
    agent_ids.sort_unstable();
    agent_ids.dedup();
    let claiming = requests.iter().any(|r| !r.claim.is_one_slot());
    let mut sections: Vec<Section> = Vec::new();
    let known: Vec<Uuid> = if agent_ids.is_empty() {
        Vec::new()
    } else if claiming {
        // The lock returns the locked (latest) rows, so their resources
        // sections are read with it.
        sections = sqlx::query_as(LOCK_AGENTS_WITH_RESOURCES)
            .bind(&agent_ids)
            .fetch_all(w.conn())
            .await
            .map_err(db("locking agents to grant"))?;
        sections.iter().map(|(id, _)| *id).collect()
    } else {
        sqlx::query_scalar(LOCK_AGENTS)
            .bind(&agent_ids)
            .fetch_all(w.conn())
            .await
            .map_err(db("locking agents to grant"))?
    };
    // After the agents: the limits the batch counts against, locked in key
    // order; the requests past them are held back.
    let limited = limits::hold_back(w, requests, &mut tasks, max_running_per_namespace).await?;
    // Planned as if every agent had room; the statement keeps, agent by
    // agent in request order, the grants its free slots allow.
    let unbounded: HashMap<Uuid, i64> = known.iter().map(|id| (*id, i64::MAX)).collect();
    let sections = sections.into_iter().map(|(id, s)| (id, s.map(|s| s.0)));
    let mut resources = agent_resources(sections, seen_claims(requests));
    let seen = Seen::of(&resources);
    let mut plan = plan_grants(requests, &unbounded, &mut resources, &tasks, now_ms);
    let written = write_grants(w, &plan, &seen, now_ms).await?;
    let mut leased = written.leased;
    let again: Vec<usize> = (0..requests.len())
        .filter(|&i| match &plan[i] {
            Err(refusal) => *refusal == GrantRefusal::ResourcesTaken,
            Ok(grant) => written.unconfirmed.contains(&grant.task_id),
        })
        .collect();
    if !again.is_empty() {
        let retried: Vec<GrantRequest> = again.iter().map(|&i| requests[i].clone()).collect();
        // Read with the agents locked: every claim is confirmed.
        let mut resources = leases::claimed_resources::<Postgres>(w.conn(), &retried).await?;
        let seen = Seen::of(&resources);
        let replanned = plan_grants(&retried, &unbounded, &mut resources, &tasks, now_ms);
        leased.extend(write_grants(w, &replanned, &seen, now_ms).await?.leased);
        for (i, planned) in again.into_iter().zip(replanned) {
            plan[i] = planned;
        }
    }
    for (request, planned) in requests.iter().zip(plan.iter_mut()) {
        if planned.as_ref().is_ok_and(|g| !leased.contains(&g.task_id)) {
            *planned = Err(GrantRefusal::AgentAtCapacity);
        } else if limited.contains(&request.task_id) {
            *planned = Err(GrantRefusal::ConcurrencyLimit);
        }
    }
    // Keyed tasks granted move their fair clocks on (the rows locked last,
    // in key order).
    let granted = plan.iter().filter_map(|p| Some(p.as_ref().ok()?.task_id));
    crate::store::sql::fair::advance_fair_clock::<Postgres>(w.conn(), granted, &tasks).await?;
    Ok(plan
        .into_iter()
        .map(|planned| match planned {
            Ok(grant) => {
                w.announce(StoreEvent::TaskChanged {
                    task_id: grant.task_id,
                    state: TaskState::Leased,
                });
                GrantOutcome::Granted(grant.lease(now_ms))
            }
            Err(refusal) => GrantOutcome::Refused(refusal),
        })
        .collect())
}

/// [`LOCK_AGENTS`] for a batch with claims of more than slots: with each
/// agent's resources section.
const LOCK_AGENTS_WITH_RESOURCES: &str =
    "SELECT id, resources FROM agents WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// A locked agent and its resources section.
type Section = (Uuid, Option<Json<Value>>);

/// What the requesters saw held on each agent they claim more than slots
/// of: the first such request's view (later ones of the batch also saw the
/// batch's earlier claims, which `plan_grants` holds as it goes).
fn seen_claims(requests: &[GrantRequest]) -> HashMap<Uuid, Vec<(Uuid, Claim)>> {
    let mut seen: HashMap<Uuid, Vec<(Uuid, Claim)>> = HashMap::new();
    for request in requests.iter().filter(|r| !r.claim.is_one_slot()) {
        seen.entry(request.agent_id).or_insert_with(|| {
            let claims = request.seen.iter().flat_map(|held| held.claims());
            claims.map(|(task, claim)| (*task, claim.clone())).collect()
        });
    }
    seen
}

/// The claims a plan counted as held before its batch, by agent and task,
/// as [`GRANT_LEASES`] confirms them.
#[derive(Default)]
struct Seen {
    agents: Vec<Uuid>,
    tasks: Vec<Uuid>,
    claims: Vec<String>,
}

impl Seen {
    fn of(resources: &HashMap<Uuid, AgentResources>) -> Seen {
        let mut seen = Seen::default();
        for (agent_id, agent) in resources {
            for (task_id, claim) in agent.held.claims() {
                if let Some(text) = rows::claim_text(claim) {
                    seen.agents.push(*agent_id);
                    seen.tasks.push(*task_id);
                    seen.claims.push(text);
                }
            }
        }
        seen
    }
}

/// What [`write_grants`] wrote.
struct Written {
    /// The tasks leased.
    leased: HashSet<Uuid>,
    /// The tasks whose claims were not written because a live lease of the
    /// agent holds something the plan did not count.
    unconfirmed: HashSet<Uuid>,
}

/// Runs [`GRANT_LEASES`] for the planned grants, confirming their claims
/// against what the plan counted as held (`seen`).
async fn write_grants(
    w: &mut Write<Postgres>,
    plan: &[Result<PlannedGrant, GrantRefusal>],
    seen: &Seen,
    now_ms: i64,
) -> Result<Written> {
    let planned: Vec<_> = plan.iter().filter_map(|p| p.as_ref().ok()).collect();
    if planned.is_empty() {
        return Ok(Written {
            leased: HashSet::new(),
            unconfirmed: HashSet::new(),
        });
    }
    let lease_ids: Vec<Uuid> = planned.iter().map(|g| g.lease_id).collect();
    let task_ids: Vec<Uuid> = planned.iter().map(|g| g.task_id).collect();
    let agent_ids: Vec<Uuid> = planned.iter().map(|g| g.agent_id).collect();
    let tokens: Vec<i64> = planned.iter().map(|g| g.fencing_token).collect();
    let expiries: Vec<i64> = planned.iter().map(|g| g.expires_at_ms).collect();
    let slots: Vec<i64> = planned.iter().map(|g| i64::from(g.claim.slots)).collect();
    let claims: Vec<Option<String>> = planned.iter().map(|g| rows::claim_text(&g.claim)).collect();
    let (fitting, leased, unconfirmed): (Vec<Uuid>, Vec<Uuid>, Vec<Uuid>) =
        sqlx::query_as(GRANT_LEASES)
            .bind(&lease_ids)
            .bind(&task_ids)
            .bind(&agent_ids)
            .bind(&tokens)
            .bind(&expiries)
            .bind(now_ms)
            .bind(&slots)
            .bind(&claims)
            .bind(&seen.agents)
            .bind(&seen.tasks)
            .bind(&seen.claims)
            .fetch_one(w.conn())
            .await
            .map_err(db("granting leases"))?;
    if leased.len() != fitting.len() {
        // Cannot happen with the rows locked above; refuse to commit rather
        // than count capacity wrongly.
        return Err(Error::Corrupt {
            context: "granting leases",
            detail: format!(
                "{} of {} locked tasks were leased",
                leased.len(),
                fitting.len()
            ),
        });
    }
    Ok(Written {
        leased: leased.into_iter().collect(),
        unconfirmed: unconfirmed.into_iter().collect(),
    })
}
