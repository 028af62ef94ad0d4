//! Concurrency limits, enforced where grants are written: each key's limit
//! of LEASED and RUNNING tasks (set by submits), and the server's limit of
//! running tasks per namespace. A grant batch that would count against a
//! limit locks it first (the key's row, `FOR UPDATE` on PostgreSQL; an
//! advisory lock per namespace), after the agents and in key order, then
//! counts what runs and holds back the requests past the limit, in request
//! order. Replicas' grants against one limit so run one after another, and
//! none exceeds it. A batch that touches no limit reads nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use uuid::Uuid;

use super::db::{Cols, StatementExt, query};
use super::{Dialect, Write};
use crate::error::Result;
use crate::model::{GrantRequest, LimitUsage, TaskState};
use crate::store::plan::{GrantableTask, db, to_u64};

const RUNNING_OF_KEY: &str = "SELECT COUNT(*) AS n FROM tasks WHERE concurrency_key IS NOT NULL \
    AND state IN ('leased', 'running') AND namespace = $1 AND concurrency_key = $2";

const RUNNING_IN_NAMESPACE: &str = "SELECT COUNT(*) AS n FROM leases l \
    JOIN agents a ON a.id = l.agent_id \
    WHERE l.state IN ('granted', 'active') AND a.namespace = $1";

const LIMIT_OF_KEY: &str =
    "SELECT max_running FROM concurrency_keys WHERE namespace = $1 AND key = $2";

const SET_LIMIT: &str = "INSERT INTO concurrency_keys (namespace, key, max_running, updated_at_ms) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (namespace, key) \
    DO UPDATE SET max_running = excluded.max_running, updated_at_ms = excluded.updated_at_ms";

/// How many of a key's tasks run, and its limit (`None`: the key has none).
async fn key_usage<DB: Dialect>(
    conn: &mut DB::Connection,
    namespace: &str,
    key: &str,
    lock: bool,
) -> Result<(u64, Option<u64>)> {
    const CONTEXT: &str = "reading a concurrency key's limit";
    let sql = if lock {
        DB::LOCK_LIMIT_KEY
    } else {
        LIMIT_OF_KEY
    };
    let limit: Option<i64> = match query::<DB>(sql)
        .text(namespace)
        .text(key)
        .optional(conn)
        .await
        .map_err(db(CONTEXT))?
    {
        Some(row) => Some(Cols::<DB>::new(&row, CONTEXT).get("max_running")?),
        None => None,
    };
    let running = count::<DB>(conn, RUNNING_OF_KEY, namespace, Some(key)).await?;
    Ok((running, limit.map(to_u64)))
}

/// A count of running tasks (of a namespace, or of its key).
async fn count<DB: Dialect>(
    conn: &mut DB::Connection,
    sql: &'static str,
    namespace: &str,
    key: Option<&str>,
) -> Result<u64> {
    const CONTEXT: &str = "counting running tasks";
    let mut statement = query::<DB>(sql).text(namespace);
    if let Some(key) = key {
        statement = statement.text(key);
    }
    let row = statement.optional(conn).await.map_err(db(CONTEXT))?;
    match row {
        Some(row) => Ok(to_u64(Cols::<DB>::new(&row, CONTEXT).get("n")?)),
        None => Ok(0),
    }
}

/// Holds back the requests a limit does not leave room for: locks the
/// limits the batch counts against, counts what runs, and takes the held
/// back tasks out of `tasks` (so planning refuses them); answers their ids.
/// `max_running_per_namespace` 0: no limit per namespace.
pub(crate) async fn hold_back<DB: Dialect>(
    w: &mut Write<DB>,
    requests: &[GrantRequest],
    tasks: &mut HashMap<Uuid, GrantableTask>,
    max_running_per_namespace: u64,
) -> Result<HashSet<Uuid>> {
    let waiting = |r: &&GrantRequest| {
        tasks
            .get(&r.task_id)
            .is_some_and(|t| t.state == TaskState::Queued)
    };
    let counted: Vec<&GrantRequest> = requests.iter().filter(waiting).collect();
    let keyed = counted
        .iter()
        .any(|r| tasks[&r.task_id].concurrency_key.is_some());
    if !keyed && max_running_per_namespace == 0 {
        return Ok(HashSet::new());
    }
    // (running, limit) by key, then by namespace, each locked in order.
    let mut keys: BTreeMap<(String, String), (u64, Option<u64>)> = BTreeMap::new();
    let mut namespaces: BTreeMap<String, u64> = BTreeMap::new();
    for r in &counted {
        let task = &tasks[&r.task_id];
        if let Some(key) = &task.concurrency_key {
            keys.insert((task.namespace.clone(), key.clone()), (0, None));
        }
        if max_running_per_namespace > 0 {
            namespaces.insert(task.namespace.clone(), 0);
        }
    }
    for ((namespace, key), usage) in &mut keys {
        *usage = key_usage::<DB>(w.conn(), namespace, key, true).await?;
    }
    for (namespace, running) in &mut namespaces {
        if let Some(lock) = DB::LOCK_NAMESPACE {
            query::<DB>(lock)
                .text(namespace)
                .run(w.conn())
                .await
                .map_err(db("locking a namespace's running limit"))?;
        }
        *running = count::<DB>(w.conn(), RUNNING_IN_NAMESPACE, namespace, None).await?;
    }
    let mut held = HashSet::new();
    for r in counted {
        let task = &tasks[&r.task_id];
        let key = task
            .concurrency_key
            .as_ref()
            .map(|k| (task.namespace.clone(), k.clone()));
        let key_full = key
            .as_ref()
            .and_then(|k| keys.get(k))
            .is_some_and(|(running, limit)| limit.is_some_and(|l| *running >= l));
        let namespace_full = max_running_per_namespace > 0
            && namespaces
                .get(&task.namespace)
                .is_some_and(|running| *running >= max_running_per_namespace);
        if key_full || namespace_full {
            held.insert(r.task_id);
            continue;
        }
        // Counted as running from here on, even if planning refuses it
        // after all: a limit is never exceeded, at worst underused.
        if let Some((running, _)) = key.as_ref().and_then(|k| keys.get_mut(k)) {
            *running += 1;
        }
        if let Some(running) = namespaces.get_mut(&task.namespace) {
            *running += 1;
        }
    }
    for id in &held {
        tasks.remove(id);
    }
    Ok(held)
}

/// Sets a key's limit (see `TaskStore::set_concurrency_limit`).
pub(crate) async fn set_limit<DB: Dialect>(
    w: &mut Write<DB>,
    namespace: &str,
    key: &str,
    limit: u32,
    now_ms: i64,
) -> Result<()> {
    query::<DB>(SET_LIMIT)
        .text(namespace)
        .text(key)
        .arg(i64::from(limit))
        .arg(now_ms)
        .run(w.conn())
        .await
        .map_err(db("setting a concurrency limit"))?;
    Ok(())
}

/// A key's limit, if it has one.
pub(crate) async fn limit_of<DB: Dialect>(
    conn: &mut DB::Connection,
    namespace: &str,
    key: &str,
) -> Result<Option<u32>> {
    const CONTEXT: &str = "reading a concurrency key's limit";
    let row = query::<DB>(LIMIT_OF_KEY)
        .text(namespace)
        .text(key)
        .optional(conn)
        .await
        .map_err(db(CONTEXT))?;
    match row {
        Some(row) => {
            let limit: i64 = Cols::<DB>::new(&row, CONTEXT).get("max_running")?;
            Ok(u32::try_from(limit).ok())
        }
        None => Ok(None),
    }
}

/// How full the limits of a task of `namespace` with `key` are.
pub(crate) async fn usage<DB: Dialect>(
    conn: &mut DB::Connection,
    namespace: &str,
    key: Option<&str>,
    max_running_per_namespace: u64,
) -> Result<LimitUsage> {
    let mut usage = LimitUsage::default();
    if let Some(key) = key {
        let (running, limit) = key_usage::<DB>(conn, namespace, key, false).await?;
        usage.key = limit.map(|limit| (running, limit));
    }
    if max_running_per_namespace > 0 {
        let running = count::<DB>(conn, RUNNING_IN_NAMESPACE, namespace, None).await?;
        usage.namespace = Some((running, max_running_per_namespace));
    }
    Ok(usage)
}
