//! Bearer tokens, stored by the SHA-256 of the token (never the token).

use super::Write;
use super::db::{Cols, SqlDb, StatementExt, query};
use super::rows::{self, TOKEN_COLUMNS};
use crate::error::Result;
use crate::model::TokenRecord;
use crate::store::plan::db;

const INSERT: &str =
    "INSERT INTO tokens (hash, name, namespace, role, created_at_ms) VALUES ($1, $2, $3, $4, $5)";

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
