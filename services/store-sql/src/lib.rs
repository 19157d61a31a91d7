//! What the SQL stores share. `switchyard-store-postgres` and `switchyard-store-sqlite` keep
//! what is theirs (connecting, migrations, error codes, locking, upserts, array binds, the
//! transaction style); the rest is written here once, over [`Handles`]: the column lists, the
//! records built from rows, the binds, and every statement both dialects run as it is.

mod exec;
pub mod host_records;
pub mod records;
mod rows;

pub mod console;
pub mod dialect;
pub mod host_ops;
#[doc(hidden)]
pub mod impl_store;
pub mod ops;

pub use dialect::{HostDialect, StoreDialect};
pub use exec::{Arg, Conn, ErrMap, Exec, Handles, Lock, Stmt, Tx, stmt};
pub use rows::{
    Cell, Col, SqlRow, all, capped, corrupt, count, first, get, json_col, json_text, one,
};
