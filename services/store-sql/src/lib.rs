//! What the SQL stores share. `switchyard-store-postgres` and `switchyard-store-sqlite` keep
//! what is theirs: connecting, migrations, error codes, row-lock clauses ([`Handles::lock`]),
//! array binds (`ANY`/`unnest` against `json_each`), the statements whose shape differs
//! ([`StoreDialect`], [`HostDialect`]) and what a write handle is. The rest is written here
//! once, over [`Handles`]: the column lists ([`records`], [`host_records`]), the records built
//! from rows, the binds ([`Stmt`]), and every statement both dialects run as it is ([`ops`],
//! [`host_ops`]; [`impl_store!`] routes each `Store` method to one or the other).

mod exec;
pub mod host_records;
pub mod records;
mod rows;
pub mod warm;

pub mod dialect;
pub mod host_ops;
#[doc(hidden)]
pub mod impl_store;
pub mod journal_rows;
pub mod ops;

pub use dialect::{HostDialect, StoreDialect};
pub use exec::{Arg, Conn, ErrMap, Exec, Handles, Lock, Stmt, Tx, stmt};
pub use rows::{
    Cell, Col, SqlRow, all, capped, corrupt, count, first, get, json_col, json_text, one,
    seqs_by_key,
};
