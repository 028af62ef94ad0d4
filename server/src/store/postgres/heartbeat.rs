//! PostgreSQL's heartbeats: a batch's renewals (answering each lease's new
//! expiry) and touches in two statements (each only when some beat needs
//! it; touches go to the narrow
//! `agent_liveness` rows), its document writes in one compare-and-set
//! statement, the rare status and kinds changes one by one.

use std::collections::HashMap;

use sqlx::Postgres;
use uuid::Uuid;

use crate::error::Result;
use crate::model::{Beat, BeatApplied, BeatOutcome, DocumentWrite, RenewedLease};
use crate::store::plan::{db, to_i64, to_u64};
use crate::store::sql::{Write, agents, tasks};

/// Renews the live leases of the agents in `$1` to `$2` plus their TTL;
/// answers each with its agent and new expiry.
const RENEW_MANY: &str = "UPDATE leases SET expires_at_ms = $2 + \
  (SELECT t.lease_ttl_ms FROM tasks t WHERE t.id = leases.task_id) \
  WHERE agent_id = ANY($1) AND state IN ('granted', 'active') \
  RETURNING agent_id, id, task_id, expires_at_ms";

/// Touches the agents in `$1` (sorted: their liveness rows are taken in id
/// order), in their narrow liveness rows: the agents rows stay unlocked.
const TOUCH_MANY: &str = "INSERT INTO agent_liveness (agent_id, last_seen_at_ms) \
  SELECT id, $2 FROM UNNEST($1::uuid[]) AS id \
  ON CONFLICT (agent_id) DO UPDATE SET last_seen_at_ms = excluded.last_seen_at_ms \
  WHERE agent_liveness.last_seen_at_ms < excluded.last_seen_at_ms";

/// Writes documents under their generation compare-and-set, in one
/// statement; answers the agents written and their new generations.
const WRITE_DOCUMENTS: &str = "UPDATE agents a SET reported = d.reported::jsonb, \
  document = d.document::jsonb, provenance = d.provenance::jsonb, generation = d.generation, \
  updated_at_ms = $6 \
  FROM UNNEST($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::text[], $7::int8[]) \
  AS d(id, expected, reported, document, provenance, generation) \
  WHERE a.id = d.id AND a.generation = d.expected RETURNING a.id, a.generation";

/// Sorted, deduplicated ids of the beats `pick` chooses.
fn beat_ids(beats: &[Beat], pick: fn(&Beat) -> bool) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = beats
        .iter()
        .filter(|b| pick(b))
        .map(|b| b.agent_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// `AgentStore::heartbeats` in `w`: the live leases of agents holding some
/// renewed and agents due a touch touched (two statements for the whole
/// batch, rows in id order), status changes (rare) one by one, and
/// documents in one compare-and-set statement.
pub(super) async fn heartbeats(
    w: &mut Write<Postgres>,
    beats: &[Beat],
    now_ms: i64,
) -> Result<Vec<Result<BeatOutcome>>> {
    let mut renewed = renew(w, beat_ids(beats, |b| b.renew), now_ms).await?;
    for_agents(
        w,
        TOUCH_MANY,
        beat_ids(beats, |b| b.touch),
        now_ms,
        "touching agents",
    )
    .await?;
    for beat in beats {
        if let Some((status, reasons)) = &beat.status {
            let epoch = Some(beat.session_epoch);
            agents::set_status(w, beat.agent_id, *status, reasons, epoch, now_ms).await?;
        }
        if let Some(kinds) = &beat.kinds {
            agents::set_kinds(w, beat.agent_id, kinds, now_ms).await?;
        }
        if beat.lift_refusals {
            tasks::lift_refusals(w, beat.agent_id).await?;
        }
    }
    let writes: Vec<(Uuid, &DocumentWrite)> = beats
        .iter()
        .filter_map(|b| b.document.as_ref().map(|d| (b.agent_id, d)))
        .collect();
    let written = write_documents(w, &writes, now_ms).await?;
    let mut results = Vec::with_capacity(beats.len());
    for beat in beats {
        let applied = match &beat.document {
            None => Ok(BeatApplied::Renewed),
            Some(_) => match written.get(&beat.agent_id) {
                Some(&generation) => Ok(BeatApplied::Written(to_u64(generation))),
                None => agents::must_fetch::<Postgres>(w.conn(), beat.agent_id)
                    .await
                    .map(|a| BeatApplied::Stale(a.generation)),
            },
        };
        let renewed = if beat.renew {
            renewed.remove(&beat.agent_id).unwrap_or_default()
        } else {
            Vec::new()
        };
        results.push(applied.map(|applied| BeatOutcome { applied, renewed }));
    }
    Ok(results)
}

/// Runs [`RENEW_MANY`] when `ids` names any agent; the leases renewed, by
/// agent.
async fn renew(
    w: &mut Write<Postgres>,
    ids: Vec<Uuid>,
    now_ms: i64,
) -> Result<HashMap<Uuid, Vec<RenewedLease>>> {
    let mut by_agent: HashMap<Uuid, Vec<RenewedLease>> = HashMap::new();
    if ids.is_empty() {
        return Ok(by_agent);
    }
    let rows = sqlx::query_as::<_, (Uuid, Uuid, Uuid, i64)>(RENEW_MANY)
        .bind(ids)
        .bind(now_ms)
        .fetch_all(w.conn())
        .await
        .map_err(db("renewing leases"))?;
    for (agent_id, lease_id, task_id, expires_at_ms) in rows {
        by_agent.entry(agent_id).or_default().push(RenewedLease {
            lease_id,
            task_id,
            expires_at_ms,
        });
    }
    Ok(by_agent)
}

/// Runs `sql` (`$1` the agents, `$2` now) when `ids` names any.
async fn for_agents(
    w: &mut Write<Postgres>,
    sql: &'static str,
    ids: Vec<Uuid>,
    now_ms: i64,
    what: &'static str,
) -> Result<()> {
    if !ids.is_empty() {
        sqlx::query(sql)
            .bind(ids)
            .bind(now_ms)
            .execute(w.conn())
            .await
            .map_err(db(what))?;
    }
    Ok(())
}

/// Runs [`WRITE_DOCUMENTS`]; the agents written and their generations.
async fn write_documents(
    w: &mut Write<Postgres>,
    writes: &[(Uuid, &DocumentWrite)],
    now_ms: i64,
) -> Result<HashMap<Uuid, i64>> {
    if writes.is_empty() {
        return Ok(HashMap::new());
    }
    let ids: Vec<Uuid> = writes.iter().map(|(id, _)| *id).collect();
    let expected: Vec<i64> = writes
        .iter()
        .map(|(_, d)| to_i64(d.expected_generation))
        .collect();
    let reported: Vec<String> = writes.iter().map(|(_, d)| d.reported.to_string()).collect();
    let documents: Vec<String> = writes.iter().map(|(_, d)| d.document.to_string()).collect();
    let provenance: Vec<String> = writes
        .iter()
        .map(|(_, d)| d.provenance.to_string())
        .collect();
    let generations: Vec<i64> = writes.iter().map(|(_, d)| to_i64(d.generation)).collect();
    Ok(sqlx::query_as::<_, (Uuid, i64)>(WRITE_DOCUMENTS)
        .bind(&ids)
        .bind(&expected)
        .bind(&reported)
        .bind(&documents)
        .bind(&provenance)
        .bind(now_ms)
        .bind(&generations)
        .fetch_all(w.conn())
        .await
        .map_err(db("writing agent documents"))?
        .into_iter()
        .collect())
}
