//! Agents: registered (an upsert on namespace and name), read, listed by
//! name, their documents replaced under a generation compare-and-set, their
//! status and drain, and heartbeats row by row (for a backend without a
//! set-based way); and [`SqlStore`]'s [`AgentStore`] implementation over
//! them.

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use super::db::{Cols, SqlDb, StatementExt, built, placeholders, query};
use super::rows::{self, AGENT_COLUMNS};
use super::{Backend, SqlStore, Write, leases, tasks};
use crate::error::{Error, Result};
use crate::model::{
    AgentParts, AgentRecord, AgentRegistration, AgentStatus, Beat, BeatApplied, BeatOutcome,
    DocumentWrite, NameContention, Page, StoreEvent, StoredName,
};
use crate::store::plan::{db, to_i64, to_u64};
use crate::store::{AgentStore, ReportedDocument};

const BY_ID: &str = const_format::concatcp!("SELECT ", AGENT_COLUMNS, " FROM agents WHERE id = $1");

fn not_found(agent_id: Uuid) -> Error {
    Error::NotFound {
        what: "agent",
        id: agent_id.to_string(),
    }
}

/// Reads an agent that must exist.
pub(crate) async fn must_fetch<DB: SqlDb>(
    conn: &mut DB::Connection,
    agent_id: Uuid,
) -> Result<AgentRecord> {
    let row = query::<DB>(BY_ID)
        .arg(agent_id)
        .optional(conn)
        .await
        .map_err(db("reading an agent"))?;
    match row {
        Some(row) => rows::agent::<DB>(&row),
        None => Err(not_found(agent_id)),
    }
}

const REGISTER: &str = const_format::concatcp!(
    "INSERT INTO agents (id, namespace, name, document, provenance, rejections, reported, \
     operator_overrides, generation, status, status_reasons, capacity, active_leases, drained, \
     labels, runner, handled_kinds, session_epoch, last_seen_at_ms, registered_at_ms, \
     updated_at_ms, registered_by) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, 'ready', $9, $10, 0, FALSE, $11, $12, $14, 1, \
     $13, $13, $13, $15) \
     ON CONFLICT (namespace, name) DO UPDATE SET \
     document = excluded.document, provenance = excluded.provenance, \
     rejections = excluded.rejections, reported = excluded.reported, \
     generation = agents.generation + 1, \
     status = CASE WHEN agents.drained THEN 'draining' ELSE 'ready' END, \
     status_reasons = CASE WHEN agents.drained THEN agents.status_reasons \
     ELSE excluded.status_reasons END, \
     capacity = excluded.capacity, labels = excluded.labels, runner = excluded.runner, \
     handled_kinds = excluded.handled_kinds, session_epoch = agents.session_epoch + 1, last_seen_at_ms = excluded.last_seen_at_ms, \
     updated_at_ms = excluded.updated_at_ms, registered_by = excluded.registered_by, \
     takeovers = CASE WHEN agents.status = 'offline' THEN agents.takeovers \
     WHEN agents.last_takeover_at_ms > $13 - ",
    NameContention::WINDOW_MS,
    " THEN agents.takeovers + 1 ELSE 1 END, \
     last_takeover_at_ms = CASE WHEN agents.status = 'offline' THEN agents.last_takeover_at_ms \
     ELSE $13 END, \
     replaced_runner = CASE WHEN agents.status = 'offline' THEN agents.replaced_runner \
     ELSE agents.runner END \
     WHERE agents.registered_by = excluded.registered_by OR agents.registered_by = '' \
     OR agents.status = 'offline' \
     RETURNING ",
    rows::AGENT_REGISTERED_COLUMNS
);

/// Registers an agent: the same id for the same (namespace, name), a new
/// session epoch and generation; an operator drain survives.
pub(crate) async fn register<DB: SqlDb>(
    w: &mut Write<DB>,
    registration: &AgentRegistration,
    now_ms: i64,
) -> Result<AgentRecord> {
    let no_reasons: [String; 0] = [];
    let row = query::<DB>(REGISTER)
        .arg(Uuid::now_v7())
        .text(&registration.namespace)
        .text(&registration.name)
        .json(&registration.document)
        .json(&registration.provenance)
        .json(&registration.rejections)
        .json(&registration.reported)
        .json(&Value::Object(serde_json::Map::new()))
        .json(&no_reasons[..])
        .arg(i64::from(registration.capacity))
        .json(&registration.labels)
        .text(&registration.runner)
        .arg(now_ms)
        .json(&registration.handled_kinds[..])
        .text(&registration.registered_by)
        .optional(w.conn())
        .await
        .map_err(db("registering an agent"))?
        // The upsert's condition held the row back: the name is another
        // token's, and its agent is online.
        .ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "agent {} is online under another token; it can be taken over once it is offline",
                registration.name
            ))
        })?;
    let agent = rows::registered::<DB>(&row, registration)?;
    tasks::lift_refusals(w, agent.id).await?;
    w.announce(StoreEvent::AgentChanged { agent_id: agent.id });
    Ok(agent)
}

/// Agents of a namespace by name, optionally only some statuses, and the
/// cursor of the next page (the last name).
pub(crate) async fn list<DB: SqlDb>(
    conn: &mut DB::Connection,
    namespace: &str,
    statuses: &[AgentStatus],
    page: &Page,
    parts: AgentParts,
) -> Result<(Vec<AgentRecord>, Option<String>)> {
    let size = page.size.clamp(1, 1_000);
    let columns = rows::agent_columns(parts);
    let mut sql = format!("SELECT {columns} FROM agents WHERE namespace = $1");
    let mut next_arg = 2;
    if !statuses.is_empty() {
        sql += &format!(
            " AND status IN ({})",
            placeholders(next_arg, statuses.len())
        );
        next_arg += statuses.len();
    }
    if page.after.is_some() {
        sql += &format!(" AND name > ${next_arg}");
        next_arg += 1;
    }
    sql += &format!(" ORDER BY name LIMIT ${next_arg}");
    let mut statement = built::<DB>(sql).text(namespace);
    for status in statuses {
        statement = statement.text(status.stored());
    }
    if let Some(after) = &page.after {
        statement = statement.text(after);
    }
    let rows = statement
        .arg(i64::from(size) + 1)
        .all(conn)
        .await
        .map_err(db("listing agents"))?;
    let mut agents = rows
        .iter()
        .map(|row| rows::agent_parts::<DB>(row, parts))
        .collect::<Result<Vec<_>>>()?;
    let next = if agents.len() > size as usize {
        agents.truncate(size as usize);
        agents.last().map(|a| a.name.clone())
    } else {
        None
    };
    Ok((agents, next))
}

/// Agents read by id at once, at most.
const BY_IDS_CHUNK: usize = 500;

/// `parts` of the agents with these ids (those that exist), in no order.
pub(crate) async fn by_ids<DB: SqlDb>(
    conn: &mut DB::Connection,
    ids: &[Uuid],
    parts: AgentParts,
) -> Result<Vec<AgentRecord>> {
    let mut agents = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(BY_IDS_CHUNK) {
        let sql = format!(
            "SELECT {} FROM agents WHERE id IN ({})",
            rows::agent_columns(parts),
            placeholders(1, chunk.len())
        );
        let mut statement = built::<DB>(sql);
        for id in chunk {
            statement = statement.arg(*id);
        }
        let rows = statement
            .all(conn)
            .await
            .map_err(db("reading agents by id"))?;
        for row in &rows {
            agents.push(rows::agent_parts::<DB>(row, parts)?);
        }
    }
    Ok(agents)
}

const IDS: &str = "SELECT id FROM agents WHERE namespace = $1 ORDER BY name";

/// The ids of a namespace's agents, by name.
pub(crate) async fn ids<DB: SqlDb>(
    conn: &mut DB::Connection,
    namespace: &str,
) -> Result<Vec<Uuid>> {
    let rows = query::<DB>(IDS)
        .text(namespace)
        .all(conn)
        .await
        .map_err(db("listing a namespace's agent ids"))?;
    rows.iter()
        .map(|row| Cols::<DB>::new(row, "reading an agent id").get("id"))
        .collect()
}

const COUNT: &str = "SELECT COUNT(*) AS n FROM agents WHERE namespace = $1";

/// Registered agents of a namespace.
pub(crate) async fn count<DB: SqlDb>(conn: &mut DB::Connection, namespace: &str) -> Result<u64> {
    let row = query::<DB>(COUNT)
        .text(namespace)
        .optional(conn)
        .await
        .map_err(db("counting a namespace's agents"))?;
    match row {
        Some(row) => Ok(to_u64(
            Cols::<DB>::new(&row, "reading an agent count").get("n")?,
        )),
        None => Ok(0),
    }
}

const REPLACE_DOCUMENT: &str = "UPDATE agents SET reported = $3, document = $4, provenance = $5, \
    rejections = $6, generation = generation + 1, updated_at_ms = $7 \
    WHERE id = $1 AND generation = $2 RETURNING generation";

/// Replaces the agent's document (a snapshot) if its generation is still
/// `expected`; the new generation, announced.
pub(crate) async fn replace_document<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    expected: u64,
    document: &ReportedDocument,
    now_ms: i64,
) -> Result<u64> {
    let row = query::<DB>(REPLACE_DOCUMENT)
        .arg(agent_id)
        .arg(to_i64(expected))
        .json(&document.reported)
        .json(&document.document)
        .json(&document.provenance)
        .json(&document.rejections)
        .arg(now_ms)
        .optional(w.conn())
        .await
        .map_err(db("updating an agent document"))?;
    match row {
        Some(row) => {
            tasks::lift_refusals(w, agent_id).await?;
            w.announce(StoreEvent::AgentChanged { agent_id });
            Ok(to_u64(generation::<DB>(&row)?))
        }
        None => Err(Error::GenerationMismatch {
            held: must_fetch::<DB>(w.conn(), agent_id).await?.generation,
            expected,
        }),
    }
}

/// The `generation` column of a row.
fn generation<DB: SqlDb>(row: &DB::Row) -> Result<i64> {
    Cols::<DB>::new(row, "reading a generation").get("generation")
}

const WRITE_DOCUMENT: &str = "UPDATE agents SET reported = $3, document = $4, provenance = $5, \
    generation = $7, updated_at_ms = $6 WHERE id = $1 AND generation = $2 RETURNING generation";

/// A document a session computed from diffs, if the generation still
/// holds; no event (see `AgentStore::heartbeats`).
async fn write_document<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    write: &DocumentWrite,
    now_ms: i64,
) -> Result<BeatApplied> {
    let row = query::<DB>(WRITE_DOCUMENT)
        .arg(agent_id)
        .arg(to_i64(write.expected_generation))
        .json(&write.reported)
        .json(&write.document)
        .json(&write.provenance)
        .arg(now_ms)
        .arg(to_i64(write.generation))
        .optional(w.conn())
        .await
        .map_err(db("writing an agent document"))?;
    Ok(match row {
        Some(row) => BeatApplied::Written(to_u64(generation::<DB>(&row)?)),
        None => BeatApplied::Stale(must_fetch::<DB>(w.conn(), agent_id).await?.generation),
    })
}

/// Records that the agent was heard from, in its narrow liveness row.
const TOUCH: &str = "INSERT INTO agent_liveness (agent_id, last_seen_at_ms) VALUES ($1, $2) \
  ON CONFLICT (agent_id) DO UPDATE SET last_seen_at_ms = excluded.last_seen_at_ms \
  WHERE agent_liveness.last_seen_at_ms < excluded.last_seen_at_ms";

const SET_KINDS: &str = "UPDATE agents SET handled_kinds = $2, updated_at_ms = $3 WHERE id = $1";

/// Records the kinds an agent handles from now on.
pub(crate) async fn set_kinds<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    kinds: &[String],
    now_ms: i64,
) -> Result<()> {
    query::<DB>(SET_KINDS)
        .arg(agent_id)
        .json(kinds)
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("recording an agent's kinds"))?;
    Ok(())
}

/// Heartbeats one by one, in agent id order.
pub(crate) async fn heartbeat_rows<DB: SqlDb>(
    w: &mut Write<DB>,
    beats: &[Beat],
    now_ms: i64,
) -> Result<Vec<Result<BeatOutcome>>> {
    let mut order: Vec<usize> = (0..beats.len()).collect();
    order.sort_by_key(|&i| beats[i].agent_id);
    let mut results: Vec<Option<Result<BeatOutcome>>> = beats.iter().map(|_| None).collect();
    for i in order {
        let beat = &beats[i];
        let renewed = if beat.renew {
            leases::renew(w, beat.agent_id, now_ms).await?
        } else {
            Vec::new()
        };
        if let Some((status, reasons)) = &beat.status {
            let epoch = Some(beat.session_epoch);
            set_status(w, beat.agent_id, *status, reasons, epoch, now_ms).await?;
        }
        if beat.touch {
            query::<DB>(TOUCH)
                .arg(beat.agent_id)
                .arg(now_ms)
                .run(w.conn())
                .await
                .map_err(db("touching an agent"))?;
        }
        if let Some(kinds) = &beat.kinds {
            set_kinds(w, beat.agent_id, kinds, now_ms).await?;
        }
        if beat.lift_refusals {
            tasks::lift_refusals(w, beat.agent_id).await?;
        }
        let applied = match &beat.document {
            Some(write) => write_document(w, beat.agent_id, write, now_ms).await,
            None => Ok(BeatApplied::Renewed),
        };
        results[i] = Some(applied.map(|applied| BeatOutcome { applied, renewed }));
    }
    Ok(results
        .into_iter()
        .map(|r| {
            r.unwrap_or(Err(Error::Corrupt {
                context: "applying heartbeats",
                detail: "a heartbeat was not processed".to_owned(),
            }))
        })
        .collect())
}

const SET_OVERRIDES: &str = const_format::concatcp!(
    "UPDATE agents SET operator_overrides = $2, document = $3, provenance = $4, \
     generation = generation + 1, updated_at_ms = $5 WHERE id = $1 RETURNING ",
    AGENT_COLUMNS
);

/// Replaces the operator tier and the merged document it yields.
pub(crate) async fn set_overrides<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    overrides: &Value,
    document: &Value,
    provenance: &Value,
    now_ms: i64,
) -> Result<AgentRecord> {
    let row = query::<DB>(SET_OVERRIDES)
        .arg(agent_id)
        .json(overrides)
        .json(document)
        .json(provenance)
        .arg(now_ms)
        .optional(w.conn())
        .await
        .map_err(db("setting operator overrides"))?
        .ok_or_else(|| not_found(agent_id))?;
    tasks::lift_refusals(w, agent_id).await?;
    w.announce(StoreEvent::AgentChanged { agent_id });
    rows::agent::<DB>(&row)
}

/// A drained agent stays DRAINING while it is up, with the operator's
/// reason (an agent's own reasons replaced it at its next heartbeat).
const SET_STATUS: &str = "UPDATE agents SET status = CASE WHEN drained AND $2 IN \
    ('ready', 'degraded') THEN 'draining' ELSE $2 END, status_reasons = CASE WHEN drained AND $2 IN \
    ('ready', 'degraded') THEN status_reasons ELSE $3 END, updated_at_ms = $5 \
    WHERE id = $1 AND ($4 IS NULL OR session_epoch = $4)";

/// Sets the status, only while the session epoch is still `session_epoch`
/// when given; whether it changed anything (announced if so).
pub(crate) async fn set_status<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    status: AgentStatus,
    reasons: &[String],
    session_epoch: Option<u64>,
    now_ms: i64,
) -> Result<bool> {
    let done = query::<DB>(SET_STATUS)
        .arg(agent_id)
        .text(StoredName::stored(status))
        .json(reasons)
        .arg(session_epoch.map(to_i64))
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("setting an agent status"))?;
    let changed = done == 1;
    if changed {
        w.announce(StoreEvent::AgentChanged { agent_id });
    }
    Ok(changed)
}

const READY_FOR_SESSION: &str = const_format::concatcp!(SET_STATUS, " RETURNING ", AGENT_COLUMNS);

/// [`set_status`] READY for a session of `session_epoch`, returning the
/// agent as stored (`None` if the epoch moved on): the session opens on
/// what it wrote, without reading the agent again.
pub(crate) async fn ready_for_session<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    session_epoch: u64,
    now_ms: i64,
) -> Result<Option<AgentRecord>> {
    let no_reasons: [String; 0] = [];
    let Some(row) = query::<DB>(READY_FOR_SESSION)
        .arg(agent_id)
        .text(StoredName::stored(AgentStatus::Ready))
        .json(&no_reasons[..])
        .arg(Some(to_i64(session_epoch)))
        .arg(now_ms)
        .optional(w.conn())
        .await
        .map_err(db("readying an agent for its session"))?
    else {
        return Ok(None);
    };
    w.announce(StoreEvent::AgentChanged { agent_id });
    rows::agent::<DB>(&row).map(Some)
}

const SET_DRAINED: &str = const_format::concatcp!(
    "UPDATE agents SET drained = $2, drain_deadline_ms = $5, \
     status = CASE WHEN $2 THEN 'draining' WHEN status = 'draining' THEN 'ready' \
     ELSE status END, status_reasons = $3, updated_at_ms = $4 WHERE id = $1 RETURNING ",
    AGENT_COLUMNS
);

/// Starts or ends an operator drain; a drain with a deadline revokes the
/// leases still held at `deadline_ms` (ending a drain clears it).
pub(crate) async fn set_drained<DB: SqlDb>(
    w: &mut Write<DB>,
    agent_id: Uuid,
    drained: bool,
    reason: Option<String>,
    deadline_ms: Option<i64>,
    now_ms: i64,
) -> Result<AgentRecord> {
    let reasons: Vec<String> = if drained {
        vec![reason.unwrap_or_else(|| "drained by operator".to_owned())]
    } else {
        Vec::new()
    };
    let row = query::<DB>(SET_DRAINED)
        .arg(agent_id)
        .arg(drained)
        .json(&reasons[..])
        .arg(now_ms)
        .arg(deadline_ms.filter(|_| drained))
        .optional(w.conn())
        .await
        .map_err(db("draining an agent"))?
        .ok_or_else(|| not_found(agent_id))?;
    w.announce(StoreEvent::AgentChanged { agent_id });
    rows::agent::<DB>(&row)
}

#[async_trait]
impl<B: Backend> AgentStore for SqlStore<B> {
    async fn register_agent(
        &self,
        registration: &AgentRegistration,
        now_ms: i64,
    ) -> Result<AgentRecord> {
        self.write(|w, _| Box::pin(register(w, registration, now_ms)))
            .await
    }

    async fn get_agent(&self, agent_id: Uuid) -> Result<AgentRecord> {
        self.read(|c, _| Box::pin(must_fetch::<B::Db>(c, agent_id)))
            .await
    }

    async fn list_agents(
        &self,
        namespace: &str,
        statuses: &[AgentStatus],
        page: &Page,
        parts: AgentParts,
    ) -> Result<(Vec<AgentRecord>, Option<String>)> {
        self.read(|c, _| Box::pin(list::<B::Db>(c, namespace, statuses, page, parts)))
            .await
    }

    async fn agents_by_ids(&self, ids: &[Uuid], parts: AgentParts) -> Result<Vec<AgentRecord>> {
        self.read(|c, _| Box::pin(by_ids::<B::Db>(c, ids, parts)))
            .await
    }

    async fn agent_ids(&self, namespace: &str) -> Result<Vec<Uuid>> {
        self.read(|c, _| Box::pin(ids::<B::Db>(c, namespace))).await
    }

    async fn agents_in_namespace(&self, namespace: &str) -> Result<u64> {
        self.read(|c, _| Box::pin(count::<B::Db>(c, namespace)))
            .await
    }

    async fn update_agent_document(
        &self,
        agent_id: Uuid,
        expected_generation: u64,
        document: &ReportedDocument,
        now_ms: i64,
    ) -> Result<u64> {
        self.write(|w, _| {
            Box::pin(replace_document(
                w,
                agent_id,
                expected_generation,
                document,
                now_ms,
            ))
        })
        .await
    }

    async fn set_operator_overrides(
        &self,
        agent_id: Uuid,
        overrides: &Value,
        document: &Value,
        provenance: &Value,
        now_ms: i64,
    ) -> Result<AgentRecord> {
        self.write(|w, _| {
            Box::pin(set_overrides(
                w, agent_id, overrides, document, provenance, now_ms,
            ))
        })
        .await
    }

    async fn set_agent_status(
        &self,
        agent_id: Uuid,
        status: AgentStatus,
        reasons: &[String],
        session_epoch: Option<u64>,
        now_ms: i64,
    ) -> Result<bool> {
        self.write(|w, _| {
            Box::pin(set_status(
                w,
                agent_id,
                status,
                reasons,
                session_epoch,
                now_ms,
            ))
        })
        .await
    }

    async fn ready_for_session(
        &self,
        agent_id: Uuid,
        session_epoch: u64,
        now_ms: i64,
    ) -> Result<Option<AgentRecord>> {
        self.write(|w, _| Box::pin(ready_for_session(w, agent_id, session_epoch, now_ms)))
            .await
    }

    async fn set_agent_drained(
        &self,
        agent_id: Uuid,
        drained: bool,
        reason: Option<String>,
        deadline_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<AgentRecord> {
        self.write(|w, _| {
            Box::pin(set_drained(
                w,
                agent_id,
                drained,
                reason,
                deadline_ms,
                now_ms,
            ))
        })
        .await
    }

    async fn heartbeats(&self, beats: &[Beat], now_ms: i64) -> Result<Vec<Result<BeatOutcome>>> {
        if beats.is_empty() {
            return Ok(Vec::new());
        }
        let backend = &self.backend;
        self.write(|w, _| Box::pin(backend.heartbeats(w, beats, now_ms)))
            .await
    }
}
