//! PostgreSQL's submit: a batch of submits in one round trip, the function
//! of migration 0019 called once with one array per column, autocommitted;
//! a batch with keyed tasks in a transaction that first takes their
//! queues' fair locks and reads each key's place.

use std::collections::HashMap;

use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgPool};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{
    GrantOutcome, GrantRefusal, LeaseRecord, LeaseState, StoreEvent, Submission, Submitted,
    TaskRecord, TaskState,
};
use crate::store::plan::db;
use crate::store::sql::{fair, tasks};
use switchyard_core::resources::Claim;

/// One batch of submits in one round trip, autocommitted: the function of
/// migration 0019 locks the reserved agents, then inserts the tasks and the
/// leases of those leased on the way in (one task by a statement of its
/// own; since migration 0023 a batch with no agent reserved by one plain
/// insert); migration 0020 has PostgreSQL keep one plan for each of its
/// statements rather than plan a call's own. A task's `submitted` entry is
/// implied by its row (`history::SUBMITTED`). A task is leased if its
/// reserved agent's live leases plus the batch's earlier grants to it
/// leave room; it is then inserted LEASED with its lease and a `leased`
/// entry after the submit, and it is announced as changed, not queued. A
/// task whose idempotency key is taken is not inserted.
pub(super) const SUBMIT_BATCH: &str = "SELECT id, leased, known FROM switchyard_submit_tasks($1::uuid[], \
  $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[], $7::int8[], $8::int8[], \
  $9::text[], $10::int8[], $11::text[], $12::uuid[], $13::uuid[], $14::text[], $15::int8[], $16::int8[], $17::int8[], $18::text[], $19::int8[], \
  $20::int8[], $21::text[], $22::int8)";

/// JSON as text, for a `text[]` parameter cast to `jsonb`.
fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::Corrupt {
        context: "encoding a task",
        detail: err.to_string(),
    })
}

/// The columns of a batch of submits, one array per column (see
/// [`SUBMIT_BATCH`]).
#[derive(Default)]
pub(super) struct SubmitRows<'a> {
    /// Where each row's answer goes in the batch.
    slot: Vec<usize>,
    ids: Vec<Uuid>,
    namespaces: Vec<&'a str>,
    kinds: Vec<&'a str>,
    payloads: Vec<String>,
    placements: Vec<String>,
    priorities: Vec<i32>,
    max_attempts: Vec<i64>,
    ttls: Vec<i64>,
    keys: Vec<Option<&'a str>>,
    not_before: Vec<i64>,
    labels: Vec<String>,
    /// The agent reserved for the task, if any, and the id of its lease.
    agents: Vec<Option<Uuid>>,
    leases: Vec<Option<Uuid>>,
    /// The retry policy's JSON, if the task names one.
    retries: Vec<Option<String>>,
    /// The deadlines' timeouts, where the task has them.
    start_timeouts: Vec<Option<i64>>,
    execution_timeouts: Vec<Option<i64>>,
    cancel_graces: Vec<Option<i64>>,
    /// The fairness key and weight, where the task has them, and its
    /// offset in the queue's rank from its submit time.
    fairness_keys: Vec<Option<&'a str>>,
    fairness_weights: Vec<Option<i64>>,
    fair_offsets: Vec<i64>,
    /// The concurrency key, where the task has one.
    concurrency_keys: Vec<Option<&'a str>>,
}

impl SubmitRows<'static> {
    /// One task, for the warm-up's rolled-back submits.
    pub(super) fn warm_up() -> Self {
        Self {
            slot: vec![0],
            ids: vec![Uuid::nil()],
            namespaces: vec!["switchyard-warm-up"],
            kinds: vec!["warm-up"],
            payloads: vec!["null".to_owned()],
            placements: vec!["{}".to_owned()],
            priorities: vec![0],
            max_attempts: vec![1],
            ttls: vec![1],
            keys: vec![None],
            not_before: vec![0],
            labels: vec!["{}".to_owned()],
            agents: vec![None],
            leases: vec![None],
            retries: vec![None],
            start_timeouts: vec![None],
            execution_timeouts: vec![None],
            cancel_graces: vec![None],
            fairness_keys: vec![None],
            fairness_weights: vec![None],
            fair_offsets: vec![0],
            concurrency_keys: vec![None],
        }
    }
}

impl<'a> SubmitRows<'a> {
    /// Adds `submission`, answered at `slot` of the batch, at `fair_offset`
    /// from its submit time in the queue's rank.
    fn push(
        &mut self,
        slot: usize,
        submission: &'a Submission,
        fair_offset: i64,
        now_ms: i64,
    ) -> Result<()> {
        let task = &submission.task;
        self.slot.push(slot);
        self.ids.push(Uuid::now_v7());
        self.namespaces.push(&task.namespace);
        self.kinds.push(&task.kind);
        self.payloads.push(task.payload.to_string());
        self.placements.push(task.placement.to_string());
        self.priorities.push(task.priority);
        self.max_attempts.push(i64::from(task.max_attempts));
        self.ttls.push(task.lease_ttl_ms);
        self.keys.push(task.idempotency_key.as_deref());
        self.not_before.push(task.not_before_ms.unwrap_or(now_ms));
        self.labels.push(json_text(&task.labels)?);
        self.agents.push(submission.agent_id);
        self.leases
            .push(submission.agent_id.map(|_| Uuid::now_v7()));
        self.retries
            .push(task.retry.as_ref().map(crate::store::sql::rows::retry_text));
        self.start_timeouts.push(task.deadlines.start_timeout_ms);
        self.execution_timeouts
            .push(task.deadlines.execution_timeout_ms);
        self.cancel_graces.push(task.deadlines.cancel_grace_ms);
        let fairness = task.fairness.as_ref();
        self.fairness_keys.push(fairness.map(|f| f.key.as_str()));
        self.fairness_weights
            .push(fairness.map(|f| i64::from(f.weight)));
        self.fair_offsets.push(fair_offset);
        self.concurrency_keys.push(task.concurrency_key.as_deref());
        Ok(())
    }
}

/// [`SUBMIT_BATCH`] with `rows` bound.
pub(super) fn submit_query<'q>(
    rows: &'q SubmitRows<'_>,
    now_ms: i64,
) -> sqlx::query::QueryAs<'q, Postgres, (Uuid, bool, bool), PgArguments> {
    sqlx::query_as(SUBMIT_BATCH)
        .bind(&rows.ids)
        .bind(&rows.namespaces)
        .bind(&rows.kinds)
        .bind(&rows.payloads)
        .bind(&rows.placements)
        .bind(&rows.priorities)
        .bind(&rows.max_attempts)
        .bind(&rows.ttls)
        .bind(&rows.keys)
        .bind(&rows.not_before)
        .bind(&rows.labels)
        .bind(&rows.agents)
        .bind(&rows.leases)
        .bind(&rows.retries)
        .bind(&rows.start_timeouts)
        .bind(&rows.execution_timeouts)
        .bind(&rows.cancel_graces)
        .bind(&rows.fairness_keys)
        .bind(&rows.fairness_weights)
        .bind(&rows.fair_offsets)
        .bind(&rows.concurrency_keys)
        .bind(now_ms)
}

/// `TaskStore::submit_many` in one round trip ([`SUBMIT_BATCH`],
/// autocommitted), with the events to announce now that it committed. Only
/// an idempotency key already taken costs a read of its own.
pub(super) async fn submit_batch(
    pool: &PgPool,
    submissions: &[Submission],
    now_ms: i64,
) -> Result<(Vec<Result<Submitted>>, Vec<StoreEvent>)> {
    let mut conn = pool.acquire().await.map_err(db("acquiring a connection"))?;
    if submissions.iter().all(|s| s.task.fairness.is_none()) {
        return submit_on(&mut conn, submissions, now_ms).await;
    }
    // Keyed tasks' ranks are read and written under their queues' fair
    // locks, so that batches committing at once (on this replica or
    // another) rank one key's tasks one after the other, never two at one
    // rank.
    let mut tx = sqlx::Acquire::begin(&mut *conn)
        .await
        .map_err(db("beginning a keyed submit"))?;
    lock_fair_queues(&mut tx, submissions).await?;
    let submitted = submit_on(&mut tx, submissions, now_ms).await?;
    tx.commit().await.map_err(db("committing a keyed submit"))?;
    Ok(submitted)
}

/// Takes the fair locks of the queues (namespace and priority) of the
/// batch's keyed tasks, in the order of their lock ids, so that two
/// batches never wait on each other.
const LOCK_FAIR_QUEUES: &str = "SELECT count(pg_advisory_xact_lock(k)) AS locked FROM \
    (SELECT DISTINCT hashtextextended('switchyard.fair.' || ns || '.' || prio::text, 0) AS k \
     FROM unnest($1::text[], $2::int4[]) AS q(ns, prio) ORDER BY k) AS queues";

/// See [`LOCK_FAIR_QUEUES`].
async fn lock_fair_queues(conn: &mut sqlx::PgConnection, submissions: &[Submission]) -> Result<()> {
    let (namespaces, priorities): (Vec<&str>, Vec<i32>) = submissions
        .iter()
        .filter(|s| s.task.fairness.is_some())
        .map(|s| (s.task.namespace.as_str(), s.task.priority))
        .unzip();
    sqlx::query(LOCK_FAIR_QUEUES)
        .bind(&namespaces)
        .bind(&priorities)
        .execute(&mut *conn)
        .await
        .map_err(db("taking the fair locks"))?;
    Ok(())
}

/// [`submit_batch`] on `conn`: one statement, and one read per fairness
/// key before it when a task has one.
async fn submit_on(
    conn: &mut sqlx::PgConnection,
    submissions: &[Submission],
    now_ms: i64,
) -> Result<(Vec<Result<Submitted>>, Vec<StoreEvent>)> {
    let mut out: Vec<Option<Result<Submitted>>> = Vec::with_capacity(submissions.len());
    let mut rows = SubmitRows::default();
    let offsets = fair_offsets(conn, submissions, now_ms).await?;
    for (submission, offset) in submissions.iter().zip(offsets) {
        match tasks::check_new(&submission.task) {
            Err(err) => out.push(Some(Err(err))),
            Ok(()) => {
                out.push(None);
                rows.push(out.len() - 1, submission, offset, now_ms)?;
            }
        }
    }
    let mut events = Vec::new();
    if rows.ids.is_empty() {
        return Ok((out.into_iter().flatten().collect(), events));
    }
    let inserted: Vec<(Uuid, bool, bool)> = submit_query(&rows, now_ms)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("inserting tasks"))?;
    // Each row: the task's id, whether it was leased and whether its
    // reserved agent exists (a gone agent is told apart from a full one);
    // a task whose key was taken is missing.
    let inserted: HashMap<Uuid, (bool, bool)> = inserted
        .into_iter()
        .map(|(id, leased, known)| (id, (leased, known)))
        .collect();
    for (row, &slot) in rows.slot.iter().enumerate() {
        let submission = &submissions[slot];
        let answer = match inserted.get(&rows.ids[row]) {
            Some(&(leased, known)) => {
                let (submitted, event) = submitted(submission, &rows, row, leased, known, now_ms);
                events.push(event);
                submitted
            }
            // Another submit with the same key came first (maybe in this
            // batch): answer with its task.
            None => (
                existing(conn, submission, rows.ids[row]).await?,
                false,
                None,
            ),
        };
        out[slot] = Some(Ok(answer));
    }
    // Keyed tasks leased on the way in leave the fair clock alone: one is
    // leased so only while nothing waits, when the clock decides nothing,
    // and a statement more (and its row lock) would be on every submit's
    // way.
    Ok((out.into_iter().flatten().collect(), events))
}

/// The task that holds `submission`'s idempotency key.
async fn existing(
    conn: &mut sqlx::PgConnection,
    submission: &Submission,
    id: Uuid,
) -> Result<TaskRecord> {
    tasks::by_key::<Postgres>(conn, &submission.task)
        .await?
        .ok_or_else(|| Error::Corrupt {
            context: "inserting tasks",
            detail: format!("task {id} was neither inserted nor found by its key"),
        })
}

/// Each submission's offset in the queue's rank from its submit time: 0
/// without a fairness key; with one, its key's next place in the weighted
/// round robin (see [`crate::model::Fairness::next_rank`]), read once per
/// key (under the queue's fair lock, see [`LOCK_FAIR_QUEUES`]) and carried
/// on through the batch. Reads nothing for a batch without keys.
async fn fair_offsets(
    conn: &mut sqlx::PgConnection,
    submissions: &[Submission],
    now_ms: i64,
) -> Result<Vec<i64>> {
    let mut offsets = vec![0; submissions.len()];
    if submissions.iter().all(|s| s.task.fairness.is_none()) {
        return Ok(offsets);
    }
    let mut last: HashMap<(&str, i32, &str), Option<i64>> = HashMap::new();
    // By namespace and priority: the first waiting keyed task's rank, and
    // the fair clock.
    let mut head: HashMap<(&str, i32), HeadAndClock> = HashMap::new();
    for (submission, offset) in submissions.iter().zip(offsets.iter_mut()) {
        let task = &submission.task;
        let Some(fairness) = &task.fairness else {
            continue;
        };
        let at = (task.namespace.as_str(), task.priority);
        let key = (at.0, at.1, fairness.key.as_str());
        let key_last = match last.get(&key) {
            Some(known) => *known,
            None => {
                let marks = fair::fair_marks::<Postgres>(conn, task, &fairness.key).await?;
                let known = head.entry(at).or_insert((marks.head, marks.clock));
                if known.0.is_none() {
                    known.0 = marks.head;
                }
                marks.last
            }
        };
        let (first, clock) = head.get(&at).copied().unwrap_or_default();
        let rank = fairness.next_rank(key_last, first, clock, now_ms);
        last.insert(key, Some(rank));
        head.insert(at, (Some(first.map_or(rank, |f| f.min(rank))), clock));
        *offset = rank - now_ms;
    }
    Ok(offsets)
}

/// The rank of the first waiting keyed task, and the fair clock.
type HeadAndClock = (Option<i64>, Option<i64>);

/// An inserted submit's answer, built from what was sent (not read back),
/// and its event.
fn submitted(
    submission: &Submission,
    rows: &SubmitRows<'_>,
    row: usize,
    leased: bool,
    known: bool,
    now_ms: i64,
) -> (Submitted, StoreEvent) {
    let task = &submission.task;
    let id = rows.ids[row];
    let mut record = TaskRecord {
        id,
        namespace: task.namespace.clone(),
        kind: task.kind.clone(),
        payload: task.payload.clone(),
        placement: task.placement.clone(),
        priority: task.priority,
        state: TaskState::Queued,
        attempts: 0,
        releases: 0,
        max_attempts: task.max_attempts,
        retry: task.retry,
        deadlines: task.deadlines,
        cancel_deadline_ms: None,
        fairness: task.fairness.clone(),
        queue_rank: now_ms + rows.fair_offsets[row],
        concurrency_key: task.concurrency_key.clone(),
        lease_ttl_ms: task.lease_ttl_ms,
        idempotency_key: task.idempotency_key.clone(),
        not_before_ms: rows.not_before[row],
        result: None,
        error: None,
        fencing_token: 0,
        lease_id: None,
        agent_id: None,
        lease_expires_at_ms: None,
        cancel_requested: false,
        progress: None,
        labels: task.labels.clone(),
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
    };
    let grant = match (submission.agent_id, rows.leases[row]) {
        (Some(agent_id), Some(lease_id)) if leased => {
            let lease = LeaseRecord {
                id: lease_id,
                task_id: id,
                agent_id,
                fencing_token: 1,
                state: LeaseState::Granted,
                granted_at_ms: now_ms,
                acked: false,
                expires_at_ms: now_ms.saturating_add(task.lease_ttl_ms),
                ended_by: None,
                claim: Claim::one_slot(),
            };
            record.state = TaskState::Leased;
            record.fencing_token = 1;
            record.lease_id = Some(lease_id);
            record.agent_id = Some(agent_id);
            record.lease_expires_at_ms = Some(lease.expires_at_ms);
            Some(GrantOutcome::Granted(lease))
        }
        (Some(_), _) if known => Some(GrantOutcome::Refused(GrantRefusal::AgentAtCapacity)),
        (Some(_), _) => Some(GrantOutcome::Refused(GrantRefusal::AgentUnknown)),
        (None, _) => None,
    };
    let event = if record.state == TaskState::Leased {
        StoreEvent::TaskChanged {
            task_id: id,
            state: TaskState::Leased,
        }
    } else {
        StoreEvent::submitted(&record)
    };
    ((record, true, grant), event)
}
