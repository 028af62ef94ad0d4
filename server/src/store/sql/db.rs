//! The sqlx bounds the shared SQL needs, stated once. [`SqlDb`] is a
//! database the shared statements run on (PostgreSQL and SQLite): each Rust
//! type they bind or read is one supertrait ([`Binds`], [`BindsRef`],
//! [`BindsJson`], [`Reads`]) checked for each database where [`SqlTypes`]
//! is implemented, and running a statement is its own method, so generic
//! code asks only `DB: SqlDb`. Statements read as
//! `query::<DB>(SQL).arg(id).text(name).json(&doc).optional(conn)`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde_json::Value;
use sqlx::types::Json;
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Postgres, Sqlite, Type,
};
use uuid::Uuid;

use crate::error::{Error, Result};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A statement with its arguments bound so far.
pub type Statement<DB> = sqlx::query::Query<'static, DB, <DB as Database>::Arguments>;

/// Binding an owned `T` as a statement argument on this database.
pub trait Binds<T>: Database {
    /// `query` with `value` as its next argument.
    fn bind_value(query: Statement<Self>, value: T) -> Statement<Self>;
}

impl<DB: Database, T> Binds<T> for DB
where
    T: for<'q> Encode<'q, DB> + Type<DB>,
{
    fn bind_value(query: Statement<Self>, value: T) -> Statement<Self> {
        query.bind(value)
    }
}

/// Binding text by reference, with no copy. (A supertrait `for<'a>
/// Binds<&'a str>` cannot be proven: sqlx's `Option` encoding needs the
/// value to outlive the statement's lifetime, so borrowed values bind
/// through their referent.)
pub trait BindsRef<T: ?Sized>: Database {
    /// `query` with `value` as its next argument.
    fn bind_ref(query: Statement<Self>, value: &T) -> Statement<Self>;
    /// `query` with `value` or NULL as its next argument.
    fn bind_opt(query: Statement<Self>, value: Option<&T>) -> Statement<Self>;
}

impl<DB: Database> BindsRef<str> for DB
where
    for<'a, 'q> &'a str: Encode<'q, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
{
    fn bind_ref(query: Statement<Self>, value: &str) -> Statement<Self> {
        query.bind(value)
    }
    fn bind_opt(query: Statement<Self>, value: Option<&str>) -> Statement<Self> {
        query.bind(value)
    }
}

/// Binding a borrowed `T` as JSON on this database, with no copy.
pub trait BindsJson<T: ?Sized>: Database {
    /// `query` with `value` as JSON as its next argument.
    fn bind_json(query: Statement<Self>, value: &T) -> Statement<Self>;
    /// `query` with `value` as JSON, or NULL, as its next argument.
    fn bind_json_opt(query: Statement<Self>, value: Option<&T>) -> Statement<Self>;
}

impl<DB: Database, T: ?Sized> BindsJson<T> for DB
where
    for<'a, 'q> Json<&'a T>: Encode<'q, DB> + Type<DB>,
    for<'a> Option<Json<&'a T>>: Encode<'a, DB> + Type<DB>,
{
    fn bind_json(query: Statement<Self>, value: &T) -> Statement<Self> {
        query.bind(Json(value))
    }
    fn bind_json_opt(query: Statement<Self>, value: Option<&T>) -> Statement<Self> {
        query.bind(value.map(Json))
    }
}

/// Reading an owned `T` from a named column of this database's rows.
pub trait Reads<T>: Database {
    /// The value of `column` in `row`.
    fn read_value(row: &Self::Row, column: &str) -> Result<T, sqlx::Error>;
}

impl<DB: Database, T> Reads<T> for DB
where
    T: for<'r> Decode<'r, DB> + Type<DB>,
    for<'c> &'c str: ColumnIndex<DB::Row>,
{
    fn read_value(row: &Self::Row, column: &str) -> Result<T, sqlx::Error> {
        sqlx::Row::try_get(row, column)
    }
}

/// The rows a statement changed (each driver's result type says it its
/// own way).
pub trait RowsAffected {
    /// How many.
    fn rows(&self) -> u64;
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// The types the shared SQL binds and reads. Implemented (empty) for each
/// database, where the compiler checks every supertrait concretely.
pub trait SqlTypes:
    Database
    + Binds<Uuid>
    + Binds<Option<Uuid>>
    + Binds<i64>
    + Binds<Option<i64>>
    + Binds<i32>
    + Binds<bool>
    + Binds<String>
    + Binds<Option<String>>
    + BindsRef<str>
    + BindsJson<Value>
    + BindsJson<BTreeMap<String, String>>
    + BindsJson<[String]>
    + Reads<Uuid>
    + Reads<Option<Uuid>>
    + Reads<i64>
    + Reads<Option<i64>>
    + Reads<i32>
    + Reads<bool>
    + Reads<String>
    + Reads<Option<String>>
    + Reads<Json<Value>>
    + Reads<Option<Json<Value>>>
    + Reads<Json<BTreeMap<String, String>>>
    + Reads<Json<Vec<String>>>
{
}

impl SqlTypes for Postgres {}
impl SqlTypes for Sqlite {}

/// A database the shared SQL runs on: its types, and running a statement
/// on one of its connections.
pub trait SqlDb: SqlTypes {
    /// Runs `query`; the rows it changed.
    fn run(
        query: Statement<Self>,
        conn: &mut Self::Connection,
    ) -> BoxFuture<'_, Result<u64, sqlx::Error>>;
    /// Runs `query`; its first row, if any.
    fn optional(
        query: Statement<Self>,
        conn: &mut Self::Connection,
    ) -> BoxFuture<'_, Result<Option<Self::Row>, sqlx::Error>>;
    /// Runs `query`; every row.
    fn all(
        query: Statement<Self>,
        conn: &mut Self::Connection,
    ) -> BoxFuture<'_, Result<Vec<Self::Row>, sqlx::Error>>;
}

impl<DB: SqlTypes> SqlDb for DB
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    DB::QueryResult: RowsAffected,
{
    fn run(
        query: Statement<Self>,
        conn: &mut Self::Connection,
    ) -> BoxFuture<'_, Result<u64, sqlx::Error>> {
        Box::pin(async move { Ok(query.execute(conn).await?.rows()) })
    }

    fn optional(
        query: Statement<Self>,
        conn: &mut Self::Connection,
    ) -> BoxFuture<'_, Result<Option<Self::Row>, sqlx::Error>> {
        Box::pin(query.fetch_optional(conn))
    }

    fn all(
        query: Statement<Self>,
        conn: &mut Self::Connection,
    ) -> BoxFuture<'_, Result<Vec<Self::Row>, sqlx::Error>> {
        Box::pin(query.fetch_all(conn))
    }
}

/// A statement of the shared SQL on database `DB`.
pub(crate) fn query<DB: SqlDb>(sql: &'static str) -> Statement<DB> {
    sqlx::query(sql)
}

/// A statement whose text was built at run time (a list of placeholders),
/// from nothing but the store's own fragments and numbers.
pub(crate) fn built<DB: SqlDb>(sql: String) -> Statement<DB> {
    sqlx::query(sqlx::AssertSqlSafe(sql))
}

/// `$from, $from+1, …` for `count` arguments: the placeholders of a list.
pub(crate) fn placeholders(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binding and running, as methods of a statement.
pub(crate) trait StatementExt<DB: SqlDb>: Sized {
    /// The statement with `value` as its next argument.
    fn arg<T>(self, value: T) -> Self
    where
        DB: Binds<T>;
    /// The statement with `value` as its next argument (text).
    fn text(self, value: &str) -> Self;
    /// The statement with `value` or NULL as its next argument (text).
    fn opt_text(self, value: Option<&str>) -> Self;
    /// The statement with `value` as JSON as its next argument.
    fn json<T: ?Sized>(self, value: &T) -> Self
    where
        DB: BindsJson<T>;
    /// The statement with `value` as JSON, or NULL, as its next argument.
    fn opt_json<T: ?Sized>(self, value: Option<&T>) -> Self
    where
        DB: BindsJson<T>;
    /// Runs it; the rows it changed.
    fn run(self, conn: &mut DB::Connection) -> BoxFuture<'_, Result<u64, sqlx::Error>>;
    /// Runs it; its first row, if any.
    fn optional(
        self,
        conn: &mut DB::Connection,
    ) -> BoxFuture<'_, Result<Option<DB::Row>, sqlx::Error>>;
    /// Runs it; every row.
    fn all(self, conn: &mut DB::Connection) -> BoxFuture<'_, Result<Vec<DB::Row>, sqlx::Error>>;
}

impl<DB: SqlDb> StatementExt<DB> for Statement<DB> {
    fn arg<T>(self, value: T) -> Self
    where
        DB: Binds<T>,
    {
        DB::bind_value(self, value)
    }
    fn text(self, value: &str) -> Self {
        DB::bind_ref(self, value)
    }
    fn opt_text(self, value: Option<&str>) -> Self {
        DB::bind_opt(self, value)
    }
    fn json<T: ?Sized>(self, value: &T) -> Self
    where
        DB: BindsJson<T>,
    {
        DB::bind_json(self, value)
    }
    fn opt_json<T: ?Sized>(self, value: Option<&T>) -> Self
    where
        DB: BindsJson<T>,
    {
        DB::bind_json_opt(self, value)
    }
    fn run(self, conn: &mut DB::Connection) -> BoxFuture<'_, Result<u64, sqlx::Error>> {
        DB::run(self, conn)
    }
    fn optional(
        self,
        conn: &mut DB::Connection,
    ) -> BoxFuture<'_, Result<Option<DB::Row>, sqlx::Error>> {
        DB::optional(self, conn)
    }
    fn all(self, conn: &mut DB::Connection) -> BoxFuture<'_, Result<Vec<DB::Row>, sqlx::Error>> {
        DB::all(self, conn)
    }
}

/// The columns of one row, read with what the store was doing as context.
pub(crate) struct Cols<'r, DB: Database> {
    row: &'r DB::Row,
    context: &'static str,
}

impl<'r, DB: SqlDb> Cols<'r, DB> {
    /// Reads `row` while doing `context`.
    pub(crate) fn new(row: &'r DB::Row, context: &'static str) -> Self {
        Self { row, context }
    }

    /// The value of `column`.
    pub(crate) fn get<T>(&self, column: &str) -> Result<T>
    where
        DB: Reads<T>,
    {
        DB::read_value(self.row, column).map_err(|source| Error::Store {
            context: self.context,
            source,
        })
    }
}
