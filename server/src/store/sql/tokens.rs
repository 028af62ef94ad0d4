//! Bearer tokens, stored by the SHA-256 of the token (never the token):
//! created, listed, revoked, rotated (the new token stored under the old
//! one's name, the old one's revocation put off by a grace) and marked used;
//! and [`SqlStore`]'s [`TokenStore`] implementation over them.

use async_trait::async_trait;

use super::db::{Cols, SqlDb, StatementExt, query};
use super::rows::{self, TOKEN_COLUMNS};
use super::{Backend, SqlStore, Write};
use crate::error::Result;
use crate::model::TokenRecord;
use crate::store::TokenStore;
use crate::store::plan::db;

const INSERT: &str = "INSERT INTO tokens (hash, name, namespace, role, created_at_ms, \
     expires_at_ms, agent_names) VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// Stores a token's record under its hash.
pub(crate) async fn insert<DB: SqlDb>(
    w: &mut Write<DB>,
    token: &TokenRecord,
    hash: &str,
) -> Result<()> {
    query::<DB>(INSERT)
        .text(hash)
        .text(&token.name)
        .text(&token.namespace)
        .text(token.role.as_str())
        .arg(token.created_at_ms)
        .arg(token.expires_at_ms)
        .text(&token.agent_names.join(","))
        .run(w.conn())
        .await
        .map_err(db("storing a token"))?;
    Ok(())
}

const ANY: &str = "SELECT EXISTS (SELECT 1 FROM tokens) AS any";

/// Whether any token was created.
pub(crate) async fn any<DB: SqlDb>(conn: &mut DB::Connection) -> Result<bool> {
    let row = query::<DB>(ANY)
        .optional(conn)
        .await
        .map_err(db("checking for tokens"))?;
    match row {
        Some(row) => Cols::<DB>::new(&row, "reading a token count").get("any"),
        None => Ok(false),
    }
}

const FIND: &str =
    const_format::concatcp!("SELECT ", TOKEN_COLUMNS, " FROM tokens WHERE hash = $1");

/// The record of the token with this hash, if any.
pub(crate) async fn find<DB: SqlDb>(
    conn: &mut DB::Connection,
    hash: &str,
) -> Result<Option<TokenRecord>> {
    let row = query::<DB>(FIND)
        .text(hash)
        .optional(conn)
        .await
        .map_err(db("looking up a token"))?;
    row.as_ref().map(rows::token::<DB>).transpose()
}

const LIST: &str = const_format::concatcp!(
    "SELECT ",
    TOKEN_COLUMNS,
    " FROM tokens WHERE ($1 = '' OR namespace = $1) ORDER BY namespace, name, created_at_ms"
);

/// Every stored token's record (of `namespace`, or of all if empty),
/// revoked and expired ones too.
pub(crate) async fn list<DB: SqlDb>(
    conn: &mut DB::Connection,
    namespace: &str,
) -> Result<Vec<TokenRecord>> {
    let found = query::<DB>(LIST)
        .text(namespace)
        .all(conn)
        .await
        .map_err(db("listing tokens"))?;
    rows::all::<DB, _>(&found, rows::token::<DB>)
}

const REVOKE: &str = "UPDATE tokens SET revoked_at_ms = $3 \
     WHERE namespace = $1 AND name = $2 AND (revoked_at_ms IS NULL OR revoked_at_ms > $3)";

/// Revokes, as of `at_ms`, every token of that name not revoked by then;
/// how many.
pub(crate) async fn revoke<DB: SqlDb>(
    w: &mut Write<DB>,
    namespace: &str,
    name: &str,
    at_ms: i64,
) -> Result<u64> {
    query::<DB>(REVOKE)
        .text(namespace)
        .text(name)
        .arg(at_ms)
        .run(w.conn())
        .await
        .map_err(db("revoking a token"))
}

const CURRENT: &str = const_format::concatcp!(
    "SELECT ",
    TOKEN_COLUMNS,
    " FROM tokens WHERE namespace = $1 AND name = $2 AND revoked_at_ms IS NULL"
);

const SCHEDULE_REVOCATION: &str =
    "UPDATE tokens SET revoked_at_ms = $2 WHERE hash = $1 AND revoked_at_ms IS NULL";

/// Stores `new_hash` as the token called `name` (same role and bindings,
/// expiring `expires_at_ms`), and revokes the current one `grace_ms` from
/// `now_ms`; the new record, or `None` when no current token has that name.
pub(crate) async fn rotate<DB: SqlDb>(
    w: &mut Write<DB>,
    namespace: &str,
    name: &str,
    new_hash: &str,
    expires_at_ms: Option<i64>,
    now_ms: i64,
    grace_ms: i64,
) -> Result<Option<TokenRecord>> {
    let row = query::<DB>(CURRENT)
        .text(namespace)
        .text(name)
        .optional(w.conn())
        .await
        .map_err(db("reading the token to rotate"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let old = rows::token::<DB>(&row)?;
    let old_hash: String = Cols::<DB>::new(&row, "reading a token").get("hash")?;
    query::<DB>(SCHEDULE_REVOCATION)
        .text(&old_hash)
        .arg(now_ms.saturating_add(grace_ms))
        .run(w.conn())
        .await
        .map_err(db("scheduling a rotated token's revocation"))?;
    let mut new = TokenRecord::new(old.name, old.namespace, old.role, now_ms);
    new.agent_names = old.agent_names;
    new.expires_at_ms = expires_at_ms;
    insert(w, &new, new_hash).await?;
    new.id = new_hash.chars().take(12).collect();
    Ok(Some(new))
}

const TOUCH: &str = "UPDATE tokens SET last_used_at_ms = $2 WHERE hash = $1";

/// Notes that the token with this hash authenticated a request at `at_ms`.
pub(crate) async fn touch<DB: SqlDb>(w: &mut Write<DB>, hash: &str, at_ms: i64) -> Result<()> {
    query::<DB>(TOUCH)
        .text(hash)
        .arg(at_ms)
        .run(w.conn())
        .await
        .map_err(db("noting a token's use"))?;
    Ok(())
}

#[async_trait]
impl<B: Backend> TokenStore for SqlStore<B> {
    async fn insert_token(&self, token: &TokenRecord, hash: &str) -> Result<()> {
        self.write(|w, _| Box::pin(insert(w, token, hash))).await
    }

    async fn any_tokens(&self) -> Result<bool> {
        self.read(|c, _| Box::pin(any::<B::Db>(c))).await
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.read(|c, _| Box::pin(find::<B::Db>(c, hash))).await
    }

    async fn list_tokens(&self, namespace: &str) -> Result<Vec<TokenRecord>> {
        self.read(|c, _| Box::pin(list::<B::Db>(c, namespace)))
            .await
    }

    async fn revoke_token(&self, namespace: &str, name: &str, at_ms: i64) -> Result<u64> {
        self.write(|w, _| Box::pin(revoke(w, namespace, name, at_ms)))
            .await
    }

    async fn rotate_token(
        &self,
        namespace: &str,
        name: &str,
        new_hash: &str,
        expires_at_ms: Option<i64>,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<Option<TokenRecord>> {
        self.write(|w, _| {
            Box::pin(rotate(
                w,
                namespace,
                name,
                new_hash,
                expires_at_ms,
                now_ms,
                grace_ms,
            ))
        })
        .await
    }

    async fn touch_token(&self, hash: &str, at_ms: i64) -> Result<()> {
        self.write(|w, _| Box::pin(touch(w, hash, at_ms))).await
    }
}
