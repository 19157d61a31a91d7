//! Running a statement the same way on either dialect: a statement is SQL text with `$n`
//! placeholders (each number first appearing in order, which SQLite reads like Postgres) and
//! its values; a handle is a pool or a transaction of one backend.

use std::borrow::Cow;

use async_trait::async_trait;
use sqlx::{Database, Pool, Postgres, Sqlite, Transaction};
use switchyard_core::error::{BackendError, BackendResult};

use crate::rows::{Cell, SqlRow, first};
use crate::warm::{Held, Warm};

/// A backend's mapping of a driver error to the store's error kinds, given the step that failed.
pub type ErrMap = fn(&'static str, sqlx::Error) -> BackendError;

/// A value bound to a placeholder: the column types both schemas use (NULL is `None`).
#[derive(Clone, Debug)]
pub enum Arg<'a> {
    Text(Option<Cow<'a, str>>),
    Int(Option<i64>),
    /// A 32-bit column (`INTEGER` in Postgres).
    Int4(i32),
    Bytes(Option<&'a [u8]>),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(Some(Cow::Borrowed(v)))
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(Some(Cow::Borrowed(v)))
    }
}

impl From<String> for Arg<'_> {
    fn from(v: String) -> Self {
        Arg::Text(Some(Cow::Owned(v)))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Arg::Text(v.map(Cow::Borrowed))
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(v: &'a Option<String>) -> Self {
        Arg::Text(v.as_deref().map(Cow::Borrowed))
    }
}

impl From<Option<String>> for Arg<'_> {
    fn from(v: Option<String>) -> Self {
        Arg::Text(v.map(Cow::Owned))
    }
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}

impl From<i32> for Arg<'_> {
    fn from(v: i32) -> Self {
        Arg::Int4(v)
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}

impl<'a> From<Option<&'a [u8]>> for Arg<'a> {
    fn from(v: Option<&'a [u8]>) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a> From<&'a Option<Vec<u8>>> for Arg<'a> {
    fn from(v: &'a Option<Vec<u8>>) -> Self {
        Arg::Bytes(v.as_deref())
    }
}

/// SQL text and the values for its placeholders, in order.
#[derive(Clone, Debug)]
pub struct Stmt<'a> {
    sql: &'a str,
    args: Vec<Arg<'a>>,
}

/// A statement with nothing bound yet.
pub fn stmt(sql: &str) -> Stmt<'_> {
    Stmt {
        sql,
        args: Vec::new(),
    }
}

impl<'a> Stmt<'a> {
    /// Binds the next placeholder.
    pub fn bind(mut self, v: impl Into<Arg<'a>>) -> Self {
        self.args.push(v.into());
        self
    }

    pub async fn fetch_all<E: Exec>(
        self,
        e: &mut E,
        what: &'static str,
    ) -> BackendResult<Vec<E::Row>> {
        e.all(self, what).await
    }

    pub async fn fetch_optional<E: Exec>(
        self,
        e: &mut E,
        what: &'static str,
    ) -> BackendResult<Option<E::Row>> {
        e.opt(self, what).await
    }

    pub async fn fetch_one<E: Exec>(self, e: &mut E, what: &'static str) -> BackendResult<E::Row> {
        e.one(self, what).await
    }

    /// The number of rows the statement changed.
    pub async fn execute<E: Exec>(self, e: &mut E, what: &'static str) -> BackendResult<u64> {
        e.run(self, what).await
    }

    /// The first column of the one row a scalar query returns.
    pub async fn scalar<T: Cell, E: Exec>(self, e: &mut E, what: &'static str) -> BackendResult<T> {
        first(&e.one(self, what).await?)
    }

    /// The first column of the row a scalar query returns, if any.
    pub async fn scalar_opt<T: Cell, E: Exec>(
        self,
        e: &mut E,
        what: &'static str,
    ) -> BackendResult<Option<T>> {
        e.opt(self, what).await?.as_ref().map(first).transpose()
    }

    /// The first column of every row.
    pub async fn scalars<T: Cell, E: Exec>(
        self,
        e: &mut E,
        what: &'static str,
    ) -> BackendResult<Vec<T>> {
        e.all(self, what).await?.iter().map(first).collect()
    }
}

/// A pool or a transaction that runs statements; `what` names the step in errors.
#[async_trait]
pub trait Exec: Send {
    type Row: SqlRow;
    async fn all(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<Vec<Self::Row>>;
    async fn opt(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<Option<Self::Row>>;
    async fn one(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<Self::Row>;
    /// Runs a statement that returns no rows; the number of rows it changed.
    async fn run(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<u64>;
    /// Makes the work durable: commits a transaction, nothing for a pool.
    async fn commit(self) -> BackendResult<()>
    where
        Self: Sized;
}

/// Statements straight on a pool, or on the connections [`Warm`] keeps from it: each is its
/// own transaction.
pub struct Conn<'a, DB: Database> {
    pool: &'a Pool<DB>,
    warm: Option<&'a Warm<DB>>,
    err: ErrMap,
}

impl<'a, DB: Database> Conn<'a, DB> {
    pub fn new(pool: &'a Pool<DB>, err: ErrMap) -> Self {
        Self {
            pool,
            warm: None,
            err,
        }
    }

    /// Statements on the connections `warm` keeps.
    pub fn warm(warm: &'a Warm<DB>, err: ErrMap) -> Self {
        Self {
            pool: warm.pool(),
            warm: Some(warm),
            err,
        }
    }
}

/// Statements in one transaction, rolled back unless committed.
pub struct Tx<DB: Database> {
    tx: Open<DB>,
    err: ErrMap,
    /// Held until the transaction ends, after it (a backend's turn at its one writer).
    hold: Option<Box<dyn Send + Sync>>,
}

/// Where a transaction runs: sqlx's own, or BEGIN on a connection [`Warm`] keeps.
enum Open<DB: Database> {
    Pool(Transaction<'static, DB>),
    Warm(Held<DB>),
}

impl<DB: Database> Tx<DB> {
    pub fn new(tx: Transaction<'static, DB>, err: ErrMap) -> Self {
        Self {
            tx: Open::Pool(tx),
            err,
            hold: None,
        }
    }

    /// The transaction, holding `hold` until it ends.
    pub fn holding(tx: Transaction<'static, DB>, err: ErrMap, hold: Box<dyn Send + Sync>) -> Self {
        Self {
            tx: Open::Pool(tx),
            err,
            hold: Some(hold),
        }
    }

    /// A transaction on a connection `warm` keeps (see [`Warm::begin`]).
    pub async fn warm(warm: &Warm<DB>, err: ErrMap) -> BackendResult<Self> {
        let held = warm.begin().await.map_err(|e| err("begin", e))?;
        Ok(Self {
            tx: Open::Warm(held),
            err,
            hold: None,
        })
    }

    /// The connection, for the dialect's own statements in this transaction.
    pub fn conn(&mut self) -> &mut DB::Connection {
        match &mut self.tx {
            Open::Pool(tx) => tx,
            Open::Warm(held) => held,
        }
    }
}

/// How strongly a transaction locks the rows it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// Against every other writer of the row.
    Update,
    /// Against other updates, not against inserts that only refer to the row.
    NoKeyUpdate,
}

/// The handles of a store: reads, single-statement writes and transactions. A backend picks
/// what each is (SQLite writes take the one writer's `BEGIN IMMEDIATE` lock, Postgres writes
/// go straight to the pool).
#[async_trait]
pub trait Handles: Send + Sync {
    type Read<'a>: Exec
    where
        Self: 'a;
    type Write<'a>: Exec
    where
        Self: 'a;
    type Tx: Exec;
    fn read(&self) -> Self::Read<'_>;
    /// What ends a `SELECT` in a transaction that locks the rows it reads until the end.
    fn lock(&self, strength: Lock) -> &'static str;
    async fn write(&self) -> BackendResult<Self::Write<'_>>;
    async fn begin(&self) -> BackendResult<Self::Tx>;
    /// A short interactive write (an idempotency claim): a backend with one writer lets it
    /// go before bulk writes that wait.
    async fn write_first(&self) -> BackendResult<Self::Write<'_>> {
        self.write().await
    }
    /// [`Handles::begin`] for a short interactive transaction, as [`Handles::write_first`].
    async fn begin_first(&self) -> BackendResult<Self::Tx> {
        self.begin().await
    }
}

/// The statement as a driver query of one dialect.
fn query<'q, DB: Database>(s: &'q Stmt<'_>) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q [u8]>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let mut q = sqlx::query(s.sql);
    for a in &s.args {
        q = match a {
            Arg::Text(v) => q.bind(v.as_deref()),
            Arg::Int(v) => q.bind(*v),
            Arg::Int4(v) => q.bind(*v),
            Arg::Bytes(v) => q.bind(*v),
        };
    }
    q
}

/// A statement of [`Conn`]: on the pool, or on a kept connection that is kept again when the
/// statement succeeded.
macro_rules! on_conn {
    ($conn:ident, $what:ident, $q:ident, $op:ident) => {{
        let err = $conn.err;
        match $conn.warm {
            None => query(&$q).$op($conn.pool).await.map_err(|e| err($what, e)),
            Some(warm) => {
                let mut held = warm.take().await.map_err(|e| err($what, e))?;
                let out = query(&$q)
                    .$op(&mut *held)
                    .await
                    .map_err(|e| err($what, e))?;
                held.keep();
                Ok(out)
            }
        }
    }};
}

macro_rules! exec_for {
    ($db:ty) => {
        #[async_trait]
        impl Exec for Conn<'_, $db> {
            type Row = <$db as Database>::Row;
            async fn all(
                &mut self,
                q: Stmt<'_>,
                what: &'static str,
            ) -> BackendResult<Vec<Self::Row>> {
                on_conn!(self, what, q, fetch_all)
            }
            async fn opt(
                &mut self,
                q: Stmt<'_>,
                what: &'static str,
            ) -> BackendResult<Option<Self::Row>> {
                on_conn!(self, what, q, fetch_optional)
            }
            async fn one(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<Self::Row> {
                on_conn!(self, what, q, fetch_one)
            }
            async fn run(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<u64> {
                Ok(on_conn!(self, what, q, execute)?.rows_affected())
            }
            async fn commit(self) -> BackendResult<()> {
                Ok(())
            }
        }

        #[async_trait]
        impl Exec for Tx<$db> {
            type Row = <$db as Database>::Row;
            async fn all(
                &mut self,
                q: Stmt<'_>,
                what: &'static str,
            ) -> BackendResult<Vec<Self::Row>> {
                let err = self.err;
                query(&q)
                    .fetch_all(self.conn())
                    .await
                    .map_err(|e| err(what, e))
            }
            async fn opt(
                &mut self,
                q: Stmt<'_>,
                what: &'static str,
            ) -> BackendResult<Option<Self::Row>> {
                let err = self.err;
                query(&q)
                    .fetch_optional(self.conn())
                    .await
                    .map_err(|e| err(what, e))
            }
            async fn one(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<Self::Row> {
                let err = self.err;
                query(&q)
                    .fetch_one(self.conn())
                    .await
                    .map_err(|e| err(what, e))
            }
            async fn run(&mut self, q: Stmt<'_>, what: &'static str) -> BackendResult<u64> {
                let err = self.err;
                let done = query(&q)
                    .execute(self.conn())
                    .await
                    .map_err(|e| err(what, e))?;
                Ok(done.rows_affected())
            }
            async fn commit(self) -> BackendResult<()> {
                let Tx { tx, err, hold } = self;
                let done = match tx {
                    Open::Pool(tx) => tx.commit().await,
                    Open::Warm(held) => held.commit().await,
                };
                drop(hold);
                done.map_err(|e| err("commit", e))
            }
        }
    };
}

exec_for!(Postgres);
exec_for!(Sqlite);
