//! Reading records out of rows: the column lists every read of a task,
//! lease or agent uses, and the decoding of each, written once for both
//! databases. A stored state name the code does not know is
//! [`Error::Corrupt`], never a default.

use std::collections::BTreeMap;

use serde_json::Value;
use sqlx::types::Json;

use super::db::{Cols, SqlDb};
use crate::error::{Error, Result};
use crate::model::{
    AgentParts, AgentRecord, AgentRegistration, AgentStatus, Deadlines, Fairness, LeaseEnd,
    LeaseRecord, LeaseState, NameContention, OutputStream, RetryPolicy, Role, StoredChunk,
    StoredName, TaskEventRecord, TaskRecord, TaskState, TokenRecord,
};
use crate::store::plan::{to_u32, to_u64};
use switchyard_core::resources::Claim;

/// The SELECT list and FROM clause that read a [`TaskRecord`] (the lease
/// expiry comes from the live lease); a statement adds its WHERE.
pub(crate) const TASK_SELECT: &str = "SELECT t.id, t.namespace, t.kind, t.payload, t.placement, \
    t.priority, t.state, t.attempts, t.releases, t.max_attempts, t.lease_ttl_ms, t.idempotency_key, \
    t.not_before_ms, t.result, t.error, t.fencing_token, t.lease_id, t.agent_id, \
    l.expires_at_ms AS lease_expires_at_ms, t.cancel_requested, t.progress, t.labels, \
    t.retry, t.start_timeout_ms, t.execution_timeout_ms, t.cancel_grace_ms, t.cancel_deadline_ms, \
    t.fairness_key, t.fairness_weight, t.created_at_ms + t.fair_offset AS queue_rank, t.concurrency_key, \
    t.created_at_ms, t.updated_at_ms \
    FROM tasks t LEFT JOIN leases l ON l.id = t.lease_id ";

/// The columns that read a [`LeaseRecord`].
pub(crate) const LEASE_COLUMNS: &str = "id, task_id, agent_id, fencing_token, state, granted_at_ms, acked, expires_at_ms, outcome, \
    slots, claim";

/// The columns of an [`AgentRecord`] apart from its JSON documents (what
/// was rejected building them is kept: it is short, and listings show it;
/// its load is the slots its live leases hold; it was last seen at the
/// later of its registration and its session's last refresh in
/// `agent_liveness`).
const AGENT_LISTING_COLUMNS: &str = "id, namespace, name, generation, status, status_reasons, capacity, \
    (SELECT CAST(COALESCE(SUM(l.slots), 0) AS BIGINT) FROM leases l WHERE l.agent_id = agents.id \
    AND l.state IN ('granted', 'active')) AS active_leases, drained, drain_deadline_ms, labels, runner, \
    handled_kinds, session_epoch, COALESCE((SELECT s.last_seen_at_ms FROM agent_liveness s \
    WHERE s.agent_id = agents.id AND s.last_seen_at_ms > agents.last_seen_at_ms), \
    agents.last_seen_at_ms) AS last_seen_at_ms, registered_at_ms, takeovers, \
    last_takeover_at_ms, replaced_runner, rejections";

/// The columns that read a whole [`AgentRecord`].
pub(crate) const AGENT_COLUMNS: &str = const_format::concatcp!(
    AGENT_LISTING_COLUMNS,
    ", document, provenance, reported, operator_overrides"
);

/// The columns that read `parts` of an [`AgentRecord`].
pub(crate) fn agent_columns(parts: AgentParts) -> &'static str {
    match parts {
        AgentParts::Listing => AGENT_LISTING_COLUMNS,
        AgentParts::Matching => const_format::concatcp!(AGENT_LISTING_COLUMNS, ", document"),
        AgentParts::Full => AGENT_COLUMNS,
    }
}

/// The columns a registration returns: the listing's and the operator
/// tier (its other documents are the ones it wrote).
pub(crate) const AGENT_REGISTERED_COLUMNS: &str =
    const_format::concatcp!(AGENT_LISTING_COLUMNS, ", operator_overrides");

/// The columns that read a [`TaskEventRecord`] and the steps its row implies
/// before it (`history::IMPLIED_STEPS`).
pub(crate) const EVENT_COLUMNS: &str = "task_id, sequence, kind, state, message, agent_id, lease_id, occurred_at_ms, \
    CAST(implied_steps AS BIGINT) AS implied_steps";

/// The columns that read a [`StoredChunk`].
pub(crate) const OUTPUT_COLUMNS: &str =
    "task_id, at_byte, end_byte, lease_id, fencing_token, sequence, stream, text, written_at_ms";

/// The columns that read a [`TokenRecord`].
pub(crate) const TOKEN_COLUMNS: &str = "hash, name, namespace, role, created_at_ms, expires_at_ms, revoked_at_ms, last_used_at_ms, agent_names";

/// A stored enum's name, parsed (a name the code does not know is corrupt
/// data).
pub(crate) fn stored<T: StoredName>(name: &str, context: &'static str) -> Result<T> {
    T::from_stored(name).map_err(|err| Error::Corrupt {
        context,
        detail: err.to_string(),
    })
}

/// A JSON column.
fn json<DB: SqlDb>(cols: &Cols<'_, DB>, column: &str) -> Result<Value> {
    Ok(cols.get::<Json<Value>>(column)?.0)
}

/// A nullable JSON column.
fn json_opt<DB: SqlDb>(cols: &Cols<'_, DB>, column: &str) -> Result<Option<Value>> {
    Ok(cols.get::<Option<Json<Value>>>(column)?.map(|j| j.0))
}

/// A labels column.
fn labels<DB: SqlDb>(cols: &Cols<'_, DB>) -> Result<BTreeMap<String, String>> {
    Ok(cols.get::<Json<BTreeMap<String, String>>>("labels")?.0)
}

/// A task, from [`TASK_SELECT`]'s columns.
pub(crate) fn task<DB: SqlDb>(row: &DB::Row) -> Result<TaskRecord> {
    const CONTEXT: &str = "reading a task row";
    let cols = Cols::<DB>::new(row, CONTEXT);
    Ok(TaskRecord {
        id: cols.get("id")?,
        namespace: cols.get("namespace")?,
        kind: cols.get("kind")?,
        payload: json(&cols, "payload")?,
        placement: json(&cols, "placement")?,
        priority: cols.get("priority")?,
        state: stored::<TaskState>(&cols.get::<String>("state")?, CONTEXT)?,
        attempts: to_u32(cols.get("attempts")?),
        releases: to_u32(cols.get("releases")?),
        max_attempts: to_u32(cols.get("max_attempts")?),
        retry: retry(cols.get("retry")?)?,
        deadlines: Deadlines {
            start_timeout_ms: cols.get("start_timeout_ms")?,
            execution_timeout_ms: cols.get("execution_timeout_ms")?,
            cancel_grace_ms: cols.get("cancel_grace_ms")?,
        },
        cancel_deadline_ms: cols.get("cancel_deadline_ms")?,
        fairness: fairness(
            cols.get("fairness_key")?,
            cols.get::<Option<i64>>("fairness_weight")?,
        ),
        queue_rank: cols.get("queue_rank")?,
        concurrency_key: cols.get("concurrency_key")?,
        lease_ttl_ms: cols.get("lease_ttl_ms")?,
        idempotency_key: cols.get("idempotency_key")?,
        not_before_ms: cols.get("not_before_ms")?,
        result: json_opt(&cols, "result")?,
        error: json_opt(&cols, "error")?,
        fencing_token: to_u64(cols.get("fencing_token")?),
        lease_id: cols.get("lease_id")?,
        agent_id: cols.get("agent_id")?,
        lease_expires_at_ms: cols.get("lease_expires_at_ms")?,
        cancel_requested: cols.get("cancel_requested")?,
        progress: json_opt(&cols, "progress")?,
        labels: labels(&cols)?,
        created_at_ms: cols.get("created_at_ms")?,
        updated_at_ms: cols.get("updated_at_ms")?,
    })
}

/// A lease, from [`LEASE_COLUMNS`].
pub(crate) fn lease<DB: SqlDb>(row: &DB::Row) -> Result<LeaseRecord> {
    const CONTEXT: &str = "reading a lease row";
    let cols = Cols::<DB>::new(row, CONTEXT);
    let ended_by = cols.get::<Option<String>>("outcome")?;
    Ok(LeaseRecord {
        id: cols.get("id")?,
        task_id: cols.get("task_id")?,
        agent_id: cols.get("agent_id")?,
        fencing_token: to_u64(cols.get("fencing_token")?),
        state: stored::<LeaseState>(&cols.get::<String>("state")?, CONTEXT)?,
        granted_at_ms: cols.get("granted_at_ms")?,
        acked: cols.get("acked")?,
        expires_at_ms: cols.get("expires_at_ms")?,
        ended_by: ended_by
            .map(|name| stored::<LeaseEnd>(&name, CONTEXT))
            .transpose()?,
        claim: claim(cols.get("slots")?, cols.get("claim")?)?,
    })
}

/// A task's fairness key and weight, from their columns (NULL: none).
fn fairness(key: Option<String>, weight: Option<i64>) -> Option<Fairness> {
    key.map(|key| Fairness {
        key,
        weight: weight.and_then(|w| u32::try_from(w).ok()).unwrap_or(1),
    })
}

/// A task's retry policy, from its `retry` column (NULL: the default).
fn retry(text: Option<String>) -> Result<Option<RetryPolicy>> {
    text.map(|text| {
        serde_json::from_str(&text).map_err(|err| Error::Corrupt {
            context: "reading a task's retry policy",
            detail: err.to_string(),
        })
    })
    .transpose()
}

/// The `retry` column of a task's retry policy.
pub(crate) fn retry_text(policy: &RetryPolicy) -> String {
    // A struct of numbers always serializes.
    serde_json::to_string(policy).unwrap_or_default()
}

/// What a lease holds, from its `slots` and `claim` columns (`claim` is
/// NULL for a lease that holds slots alone).
pub(crate) fn claim(slots: i64, text: Option<String>) -> Result<Claim> {
    let mut claim = match text {
        None => Claim::default(),
        Some(text) => serde_json::from_str(&text).map_err(|err| Error::Corrupt {
            context: "reading a lease's claim",
            detail: err.to_string(),
        })?,
    };
    claim.slots = to_u32(slots);
    Ok(claim)
}

/// The `claim` column of what a lease holds: NULL when it holds slots alone.
pub(crate) fn claim_text(claim: &Claim) -> Option<String> {
    let only_slots = Claim {
        slots: claim.slots,
        ..Claim::default()
    };
    (claim != &only_slots).then(|| {
        let mut stored = claim.clone();
        stored.slots = 0;
        serde_json::to_string(&stored).unwrap_or_default()
    })
}

/// An agent, from [`AGENT_COLUMNS`].
pub(crate) fn agent<DB: SqlDb>(row: &DB::Row) -> Result<AgentRecord> {
    agent_parts::<DB>(row, AgentParts::Full)
}

/// `parts` of an agent, from [`agent_columns`]`(parts)`; the documents not
/// read are `null`.
pub(crate) fn agent_parts<DB: SqlDb>(row: &DB::Row, parts: AgentParts) -> Result<AgentRecord> {
    const CONTEXT: &str = "reading an agent row";
    let cols = Cols::<DB>::new(row, CONTEXT);
    let full = parts == AgentParts::Full;
    let read = |column: &str, wanted: bool| -> Result<Value> {
        if wanted {
            json(&cols, column)
        } else {
            Ok(Value::Null)
        }
    };
    Ok(AgentRecord {
        id: cols.get("id")?,
        namespace: cols.get("namespace")?,
        name: cols.get("name")?,
        document: read("document", parts != AgentParts::Listing)?,
        provenance: read("provenance", full)?,
        rejections: json(&cols, "rejections")?,
        reported: read("reported", full)?,
        operator_overrides: read("operator_overrides", full)?,
        generation: to_u64(cols.get("generation")?),
        status: stored::<AgentStatus>(&cols.get::<String>("status")?, CONTEXT)?,
        status_reasons: cols.get::<Json<Vec<String>>>("status_reasons")?.0,
        capacity: to_u32(cols.get("capacity")?),
        active_leases: to_u32(cols.get("active_leases")?),
        drained: cols.get("drained")?,
        drain_deadline_ms: cols.get("drain_deadline_ms")?,
        labels: labels(&cols)?,
        runner: cols.get("runner")?,
        handled_kinds: cols.get::<Json<Vec<String>>>("handled_kinds")?.0,
        session_epoch: to_u64(cols.get("session_epoch")?),
        last_seen_at_ms: cols.get("last_seen_at_ms")?,
        registered_at_ms: cols.get("registered_at_ms")?,
        contention: NameContention {
            takeovers: to_u32(cols.get("takeovers")?),
            last_at_ms: cols.get("last_takeover_at_ms")?,
            replaced_runner: cols.get("replaced_runner")?,
        },
    })
}

/// The agent `registration` wrote, from [`AGENT_REGISTERED_COLUMNS`]: the
/// documents it wrote are taken as written, not read back and parsed.
pub(crate) fn registered<DB: SqlDb>(
    row: &DB::Row,
    registration: &AgentRegistration,
) -> Result<AgentRecord> {
    let mut agent = agent_parts::<DB>(row, AgentParts::Listing)?;
    agent.operator_overrides = json(
        &Cols::<DB>::new(row, "reading a registered agent row"),
        "operator_overrides",
    )?;
    agent.document = registration.document.clone();
    agent.provenance = registration.provenance.clone();
    agent.reported = registration.reported.clone();
    Ok(agent)
}

/// A history entry and how many steps its row implies before it, from
/// [`EVENT_COLUMNS`].
pub(crate) fn event<DB: SqlDb>(row: &DB::Row) -> Result<(TaskEventRecord, usize)> {
    const CONTEXT: &str = "reading a task event row";
    let cols = Cols::<DB>::new(row, CONTEXT);
    let implied: i64 = cols.get("implied_steps")?;
    let implied = usize::try_from(implied).map_err(|_| Error::Corrupt {
        context: CONTEXT,
        detail: format!("implied_steps {implied}"),
    })?;
    let entry = TaskEventRecord {
        task_id: cols.get("task_id")?,
        sequence: to_u64(cols.get("sequence")?),
        kind: cols.get("kind")?,
        state: stored::<TaskState>(&cols.get::<String>("state")?, CONTEXT)?,
        message: cols.get("message")?,
        agent_id: cols.get("agent_id")?,
        lease_id: cols.get("lease_id")?,
        occurred_at_ms: cols.get("occurred_at_ms")?,
    };
    Ok((entry, implied))
}

/// A piece of a task's output, from [`OUTPUT_COLUMNS`].
pub(crate) fn chunk<DB: SqlDb>(row: &DB::Row) -> Result<StoredChunk> {
    const CONTEXT: &str = "reading a task output row";
    let cols = Cols::<DB>::new(row, CONTEXT);
    Ok(StoredChunk {
        task_id: cols.get("task_id")?,
        lease_id: cols.get("lease_id")?,
        fencing_token: to_u64(cols.get("fencing_token")?),
        sequence: to_u64(cols.get("sequence")?),
        stream: stored::<OutputStream>(&cols.get::<String>("stream")?, CONTEXT)?,
        text: cols.get("text")?,
        at_byte: to_u64(cols.get("at_byte")?),
        end_byte: to_u64(cols.get("end_byte")?),
        written_at_ms: cols.get("written_at_ms")?,
    })
}

/// A token's record, from [`TOKEN_COLUMNS`].
pub(crate) fn token<DB: SqlDb>(row: &DB::Row) -> Result<TokenRecord> {
    const CONTEXT: &str = "reading a token row";
    let cols = Cols::<DB>::new(row, CONTEXT);
    Ok(TokenRecord {
        name: cols.get("name")?,
        namespace: cols.get("namespace")?,
        role: stored::<Role>(&cols.get::<String>("role")?, CONTEXT)?,
        created_at_ms: cols.get("created_at_ms")?,
        expires_at_ms: cols.get("expires_at_ms")?,
        revoked_at_ms: cols.get("revoked_at_ms")?,
        last_used_at_ms: cols.get("last_used_at_ms")?,
        agent_names: cols
            .get::<String>("agent_names")?
            .split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        id: cols.get::<String>("hash")?.chars().take(12).collect(),
    })
}

/// Decodes every row with `decode`.
pub(crate) fn all<DB: SqlDb, T>(
    rows: &[DB::Row],
    decode: fn(&DB::Row) -> Result<T>,
) -> Result<Vec<T>> {
    rows.iter().map(decode).collect()
}
