//! Reading rows the same way on either dialect: a row hands out the column types both schemas
//! use, and the record builders are written once over that.

use serde::de::DeserializeOwned;
use sqlx::Row;
use switchyard_core::error::{BackendError, BackendResult, ErrorKind};

/// A column by name, or by position (a scalar query's first column).
#[derive(Clone, Copy, Debug)]
pub enum Col<'a> {
    Name(&'a str),
    At(usize),
}

impl<'a> From<&'a str> for Col<'a> {
    fn from(c: &'a str) -> Self {
        Col::Name(c)
    }
}

impl From<usize> for Col<'_> {
    fn from(i: usize) -> Self {
        Col::At(i)
    }
}

/// A result row of either dialect. `None` is SQL NULL.
pub trait SqlRow: Send + Sync + 'static {
    fn text(&self, col: Col<'_>) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, col: Col<'_>) -> Result<Option<i64>, sqlx::Error>;
    /// A 32-bit column (`INTEGER` in Postgres).
    fn int4(&self, col: Col<'_>) -> Result<Option<i32>, sqlx::Error>;
    fn bytes(&self, col: Col<'_>) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

macro_rules! sql_row {
    ($row:ty) => {
        impl SqlRow for $row {
            fn text(&self, col: Col<'_>) -> Result<Option<String>, sqlx::Error> {
                match col {
                    Col::Name(c) => self.try_get(c),
                    Col::At(i) => self.try_get(i),
                }
            }
            fn int(&self, col: Col<'_>) -> Result<Option<i64>, sqlx::Error> {
                match col {
                    Col::Name(c) => self.try_get(c),
                    Col::At(i) => self.try_get(i),
                }
            }
            fn int4(&self, col: Col<'_>) -> Result<Option<i32>, sqlx::Error> {
                match col {
                    Col::Name(c) => self.try_get(c),
                    Col::At(i) => self.try_get(i),
                }
            }
            fn bytes(&self, col: Col<'_>) -> Result<Option<Vec<u8>>, sqlx::Error> {
                match col {
                    Col::Name(c) => self.try_get(c),
                    Col::At(i) => self.try_get(i),
                }
            }
        }
    };
}

sql_row!(sqlx::postgres::PgRow);
sql_row!(sqlx::sqlite::SqliteRow);

/// A value read from one column.
pub trait Cell: Sized {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error>;
}

fn not_null<T>(v: Option<T>, col: Col<'_>) -> Result<T, sqlx::Error> {
    v.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: format!("{col:?}"),
        source: Box::new(sqlx::error::UnexpectedNullError),
    })
}

impl Cell for Option<String> {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error> {
        row.text(col)
    }
}

impl Cell for String {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error> {
        not_null(row.text(col)?, col)
    }
}

impl Cell for Option<i64> {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error> {
        row.int(col)
    }
}

impl Cell for i64 {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error> {
        not_null(row.int(col)?, col)
    }
}

impl Cell for i32 {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error> {
        not_null(row.int4(col)?, col)
    }
}

impl Cell for Option<Vec<u8>> {
    fn read(row: &impl SqlRow, col: Col<'_>) -> Result<Self, sqlx::Error> {
        row.bytes(col)
    }
}

/// One column of a row.
pub fn get<'c, T: Cell>(row: &impl SqlRow, col: impl Into<Col<'c>>) -> BackendResult<T> {
    T::read(row, col.into())
        .map_err(|e| BackendError::with_source(ErrorKind::Internal, "decode row", e))
}

/// A scalar query's value: its first column.
pub fn first<T: Cell>(row: &impl SqlRow) -> BackendResult<T> {
    get(row, 0)
}

pub fn corrupt(what: &str) -> BackendError {
    BackendError::internal(format!("stored {what} is not valid"))
}

/// The seqs a multi-row outbox insert gave, in the order of `keys` (its items'
/// `(channel_id, message_id)`): `RETURNING` promises no order, so each returned row (with
/// columns `channel_id`, `message_id`, `seq`) is matched to its item by key.
pub fn seqs_by_key<'k>(
    rows: &[impl SqlRow],
    keys: impl Iterator<Item = (&'k str, &'k str)>,
) -> BackendResult<Vec<i64>> {
    let mut at = std::collections::HashMap::with_capacity(rows.len());
    for r in rows {
        let key: (String, String) = (get(r, "channel_id")?, get(r, "message_id")?);
        at.insert(key, get::<i64>(r, "seq")?);
    }
    keys.map(|(c, m)| {
        at.get(&(c.to_owned(), m.to_owned()))
            .copied()
            .ok_or_else(|| BackendError::internal("outbox insert lost a row"))
    })
    .collect()
}

pub fn json_text(v: &impl serde::Serialize) -> BackendResult<String> {
    serde_json::to_string(v)
        .map_err(|e| BackendError::with_source(ErrorKind::Internal, "encode json", e))
}

pub fn json_col<T: DeserializeOwned>(row: &impl SqlRow, col: &str) -> BackendResult<T> {
    let text: String = get(row, col)?;
    serde_json::from_str(&text)
        .map_err(|e| BackendError::with_source(ErrorKind::Internal, "decode stored json", e))
}

/// A count as stored (never negative) as the `u64` the store reports.
pub fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A caller's bound (`u64`) as the `BIGINT` a `LIMIT` takes.
pub fn capped(at_most: u64) -> i64 {
    i64::try_from(at_most).unwrap_or(i64::MAX)
}

pub fn all<R, T>(rows: Vec<R>, f: fn(&R) -> BackendResult<T>) -> BackendResult<Vec<T>> {
    rows.iter().map(f).collect()
}

pub fn one<R, T>(row: Option<R>, f: fn(&R) -> BackendResult<T>) -> BackendResult<Option<T>> {
    row.as_ref().map(f).transpose()
}
