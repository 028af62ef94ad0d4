//! SQLite's grant, set-based: the agents' free slots and the requested
//! tasks read in one statement each, the grants planned as the row-by-row
//! path plans them (`plan_grants`, after the limits and the claimed
//! resources), then the leases, the tasks LEASED and their history written
//! in one statement each. The one writer holds the database for the whole
//! transaction, so what was read cannot change before it is written.

use serde_json::{Value, json};
use sqlx::Sqlite;

use super::batch::{self, hex};
use crate::error::{Error, Result};
use crate::model::{GrantOutcome, GrantRefusal, GrantRequest, StoreEvent, TaskState};
use crate::store::plan::{PlannedGrant, db, plan_grants};
use crate::store::sql::db::Cols;
use crate::store::sql::{Write, fair, leases, limits, rows};

/// Each named agent's free slots (`$1`: JSON array of hex ids).
const AGENTS_FREE: &str = "SELECT a.id, a.capacity - (SELECT CAST(COALESCE(SUM(l.slots), 0) \
    AS BIGINT) FROM leases l WHERE l.agent_id = a.id AND l.state IN ('granted', 'active')) AS free \
    FROM agents a WHERE a.id IN (SELECT unhex(value) FROM jsonb_each($1))";

/// The named tasks, as `leases::grantable_task` reads them.
const TASKS_TO_GRANT: &str = "SELECT id, state, not_before_ms, fencing_token, lease_ttl_ms, \
    namespace, concurrency_key, priority, \
    CASE WHEN fairness_key IS NULL THEN NULL ELSE created_at_ms + fair_offset END AS fair_rank \
    FROM tasks WHERE id IN (SELECT unhex(value) FROM jsonb_each($1))";

/// The grants' leases (`$1`: JSON array of [`grant_row`] objects).
const INSERT_LEASES: &str = "INSERT INTO leases (id, task_id, agent_id, fencing_token, state, \
    acked, granted_at_ms, expires_at_ms, slots, claim) \
    SELECT unhex(g.value ->> 'lease'), unhex(g.value ->> 'task'), unhex(g.value ->> 'agent'), \
    g.value ->> 'token', 'granted', FALSE, $2, g.value ->> 'expires', g.value ->> 'slots', \
    g.value ->> 'claim' FROM jsonb_each($1) g";

/// The grants' tasks LEASED, each only if still queued.
const LEASE_TASKS: &str = "UPDATE tasks SET state = 'leased', fencing_token = g.token, \
    lease_id = g.lease, agent_id = g.agent, progress = NULL, updated_at_ms = $2 \
    FROM (SELECT unhex(value ->> 'task') AS task, value ->> 'token' AS token, \
    unhex(value ->> 'lease') AS lease, unhex(value ->> 'agent') AS agent FROM jsonb_each($1)) AS g \
    WHERE tasks.id = g.task AND tasks.state = 'queued'";

/// A planned grant as one element of [`INSERT_LEASES`]' and
/// [`LEASE_TASKS`]' array.
fn grant_row(grant: &PlannedGrant) -> Value {
    json!({
        "lease": hex(grant.lease_id),
        "task": hex(grant.task_id),
        "agent": hex(grant.agent_id),
        "token": grant.fencing_token,
        "expires": grant.expires_at_ms,
        "slots": grant.claim.slots,
        "claim": rows::claim_text(&grant.claim),
    })
}

/// Grants in `w` (see `LeaseStore::grant_leases`): planned by `plan_grants`,
/// as PostgreSQL's grant is, in a handful of statements for the whole batch.
pub(super) async fn grant(
    w: &mut Write<Sqlite>,
    requests: &[GrantRequest],
    max_running_per_namespace: u64,
    now_ms: i64,
) -> Result<Vec<GrantOutcome>> {
    let agent_ids = requests.iter().map(|r| r.agent_id);
    let free = batch::read(w, AGENTS_FREE, agent_ids, |row| {
        let cols = Cols::<Sqlite>::new(row, "reading free slots");
        Ok((cols.get("id")?, cols.get("free")?))
    })
    .await?;
    let task_ids = requests.iter().map(|r| r.task_id);
    let mut grantable = batch::read(w, TASKS_TO_GRANT, task_ids, |row| {
        let id = Cols::<Sqlite>::new(row, "reading a task to grant").get("id")?;
        Ok((id, leases::grantable_task::<Sqlite>(row)?))
    })
    .await?;
    let limited = limits::hold_back(w, requests, &mut grantable, max_running_per_namespace).await?;
    let mut resources = leases::claimed_resources::<Sqlite>(w.conn(), requests).await?;
    let plan = plan_grants(requests, &free, &mut resources, &grantable, now_ms);
    let granted: Vec<&PlannedGrant> = plan.iter().filter_map(|p| p.as_ref().ok()).collect();
    if !granted.is_empty() {
        write(w, &granted, now_ms).await?;
    }
    let granted_ids = granted.iter().map(|g| g.task_id);
    fair::advance_fair_clock::<Sqlite>(w.conn(), granted_ids, &grantable).await?;
    Ok(requests
        .iter()
        .zip(plan)
        .map(|(request, planned)| match planned {
            Ok(grant) => {
                w.announce(StoreEvent::TaskChanged {
                    task_id: grant.task_id,
                    state: TaskState::Leased,
                });
                GrantOutcome::Granted(grant.lease(now_ms))
            }
            Err(_) if limited.contains(&request.task_id) => {
                GrantOutcome::Refused(GrantRefusal::ConcurrencyLimit)
            }
            Err(refusal) => GrantOutcome::Refused(refusal),
        })
        .collect())
}

/// Writes the planned grants: leases, tasks, history. Every task was read
/// queued in this transaction, so every one is leased, or the transaction
/// is refused.
async fn write(w: &mut Write<Sqlite>, granted: &[&PlannedGrant], now_ms: i64) -> Result<()> {
    let rows = Value::Array(granted.iter().map(|g| grant_row(g)).collect()).to_string();
    sqlx::query(INSERT_LEASES)
        .bind(&rows)
        .bind(now_ms)
        .execute(w.conn())
        .await
        .map_err(db("inserting leases"))?;
    let leased = sqlx::query(LEASE_TASKS)
        .bind(&rows)
        .bind(now_ms)
        .execute(w.conn())
        .await
        .map_err(db("leasing tasks"))?
        .rows_affected();
    if usize::try_from(leased).ok() != Some(granted.len()) {
        return Err(Error::Corrupt {
            context: "granting leases",
            detail: format!("{leased} of {} planned tasks were leased", granted.len()),
        });
    }
    let entries = granted
        .iter()
        .map(|g| {
            let message = format!(
                "leased to agent {} with fencing token {}",
                g.agent_id, g.fencing_token
            );
            let state = TaskState::Leased;
            batch::entry(
                g.task_id,
                1,
                "leased",
                state,
                &message,
                Some((g.agent_id, g.lease_id)),
            )
        })
        .collect();
    batch::append(w, entries, now_ms).await?;
    Ok(())
}
