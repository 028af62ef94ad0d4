//! PostgreSQL's grant: the tasks locked (`SKIP LOCKED`), the agents
//! locked in id order, the claims of more than slots checked against what
//! the agents' live leases hold, and one statement that keeps the grants
//! their free slots allow and writes leases, tasks and history.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use sqlx::Postgres;
use sqlx::types::Json;
use switchyard_core::resources::Claim;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{GrantOutcome, GrantRefusal, GrantRequest, StoreEvent, TaskState};
use crate::store::plan::{
    AgentResources, GrantableTask, PlannedGrant, agent_resources, claiming_agents, db, plan_grants,
};
use crate::store::sql::{Write, leases, rows};

/// Locks agent rows to grant to them, in id order (every grant and submit
/// locks them so, and concurrent ones queue instead of deadlocking);
/// answers the ids of those that exist.
const LOCK_AGENTS: &str = "SELECT id FROM agents WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// The requested tasks, locked, by id alone: with `state = 'queued'` in the
/// condition the planner may read the rows through the queue's partial
/// index (it does whenever its statistics undercount the queue, as after a
/// burst of submits) and filter the whole queue by id. The state is
/// checked in `plan_grants`.
const LOCK_TASKS_TO_GRANT: &str = "SELECT id, state, not_before_ms, fencing_token, \
  lease_ttl_ms FROM tasks WHERE id = ANY($1) FOR UPDATE SKIP LOCKED";

/// The grants of a batch that fit their agents' free slots, written: the
/// leases, the tasks LEASED, one history entry each. Answers the task ids
/// that fit and those leased (the same, with the tasks locked). A task is
/// updated only if its fencing token is still the one the grant was planned
/// on.
const GRANT_LEASES: &str = "\
WITH g AS ( \
  SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::int8[], $5::int8[], $7::int8[], \
  $8::text[]) WITH ORDINALITY AS g(lease_id, task_id, agent_id, token, expires_at_ms, slots, \
  claim, ord) \
), live AS ( \
  SELECT l.agent_id, SUM(l.slots) AS n FROM leases l \
  WHERE l.agent_id = ANY($3) AND l.state IN ('granted', 'active') GROUP BY l.agent_id \
), fit AS ( \
  SELECT r.* FROM ( \
    SELECT g.*, SUM(g.slots) OVER (PARTITION BY g.agent_id ORDER BY g.ord) AS rn FROM g \
  ) r JOIN agents a ON a.id = r.agent_id LEFT JOIN live ON live.agent_id = r.agent_id \
  WHERE COALESCE(live.n, 0) + r.rn <= a.capacity \
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
  WHERE e.task_id = fit.task_id), 0) + 1, 'leased', 'leased', \
  'leased to agent ' || fit.agent_id::text || ' with fencing token ' || fit.token::text, \
  fit.agent_id, fit.lease_id, $6 FROM fit \
) \
SELECT ARRAY(SELECT task_id FROM fit), ARRAY(SELECT id FROM leased)";

/// Grants in `w` (see `LeaseStore::grant_leases`), in four statements: the
/// requested tasks are locked (`SKIP LOCKED`: one another transaction is
/// changing is refused), then the agents (in id order, as every grant and
/// submit locks them, so concurrent grants queue instead of deadlocking),
/// and then one statement counts the agents' live leases, keeps the grants
/// that fit their capacity, and writes leases, tasks and history. The count
/// is a statement after the agent locks, so it sees every grant committed
/// before this one; the agents stay locked only for that statement and the
/// commit.
pub(super) async fn grant(
    w: &mut Write<Postgres>,
    requests: &[GrantRequest],
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
    let mut sections = Vec::new();
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
    // Planned as if every agent had room; the statement keeps, agent by
    // agent in request order, the grants its free slots allow. Claims of
    // more than slots are checked here against what the agents' live
    // leases hold, read now that the agents are locked.
    let unbounded: HashMap<Uuid, i64> = known.iter().map(|id| (*id, i64::MAX)).collect();
    let mut resources = claimed_resources(w, requests, sections).await?;
    let mut plan = plan_grants(requests, &unbounded, &mut resources, &tasks, now_ms);
    let leased = write_grants(w, &plan, now_ms).await?;
    for planned in &mut plan {
        if planned.as_ref().is_ok_and(|g| !leased.contains(&g.task_id)) {
            *planned = Err(GrantRefusal::AgentAtCapacity);
        }
    }
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

/// What the live leases of the agents hold beyond slots.
const CLAIMS_OF: &str = "SELECT agent_id, task_id, slots, claim FROM leases \
  WHERE agent_id = ANY($1) AND state IN ('granted', 'active') AND claim IS NOT NULL";

/// A locked agent and its resources section.
type Section = (Uuid, Option<Json<Value>>);

/// `leases::claimed_resources` for PostgreSQL: the offers from the agents'
/// resources `sections` (read with their locks) and one statement for what
/// their live leases hold, read after the locks.
async fn claimed_resources(
    w: &mut Write<Postgres>,
    requests: &[GrantRequest],
    sections: Vec<Section>,
) -> Result<HashMap<Uuid, AgentResources>> {
    let agent_ids = claiming_agents(requests);
    if agent_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let live: Vec<(Uuid, Uuid, i64, Option<String>)> = sqlx::query_as(CLAIMS_OF)
        .bind(&agent_ids)
        .fetch_all(w.conn())
        .await
        .map_err(db("reading live leases' claims"))?;
    let mut claims: HashMap<Uuid, Vec<(Uuid, Claim)>> = HashMap::new();
    for (agent_id, task_id, slots, claim) in live {
        let claim = rows::claim(slots, claim)?;
        claims.entry(agent_id).or_default().push((task_id, claim));
    }
    let sections = sections
        .into_iter()
        .filter(|(id, _)| agent_ids.binary_search(id).is_ok())
        .map(|(id, section)| (id, section.map(|s| s.0)));
    Ok(agent_resources(sections, claims))
}

/// Runs [`GRANT_LEASES`] for the planned grants; the tasks it leased.
async fn write_grants(
    w: &mut Write<Postgres>,
    plan: &[Result<PlannedGrant, GrantRefusal>],
    now_ms: i64,
) -> Result<HashSet<Uuid>> {
    let planned: Vec<_> = plan.iter().filter_map(|p| p.as_ref().ok()).collect();
    if planned.is_empty() {
        return Ok(HashSet::new());
    }
    let lease_ids: Vec<Uuid> = planned.iter().map(|g| g.lease_id).collect();
    let task_ids: Vec<Uuid> = planned.iter().map(|g| g.task_id).collect();
    let agent_ids: Vec<Uuid> = planned.iter().map(|g| g.agent_id).collect();
    let tokens: Vec<i64> = planned.iter().map(|g| g.fencing_token).collect();
    let expiries: Vec<i64> = planned.iter().map(|g| g.expires_at_ms).collect();
    let slots: Vec<i64> = planned.iter().map(|g| i64::from(g.claim.slots)).collect();
    let claims: Vec<Option<String>> = planned.iter().map(|g| rows::claim_text(&g.claim)).collect();
    let (fitting, leased): (Vec<Uuid>, Vec<Uuid>) = sqlx::query_as(GRANT_LEASES)
        .bind(&lease_ids)
        .bind(&task_ids)
        .bind(&agent_ids)
        .bind(&tokens)
        .bind(&expiries)
        .bind(now_ms)
        .bind(&slots)
        .bind(&claims)
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
    Ok(leased.into_iter().collect())
}
