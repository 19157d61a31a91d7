//! Connections kept out of the pool between uses, so a statement costs one round trip to the
//! server and not three.
//!
//! sqlx (0.8) tests a connection when its pool hands it out (`test_before_acquire`, a ping)
//! and again, always, when the pool takes it back: a statement on the pool is three round
//! trips, a transaction two more than its statements, BEGIN and COMMIT. A connection whose
//! statement or transaction succeeded waits here instead, and the next use takes it as it is.
//! One that waited longer than [`WARM_FOR`] is tested first, as the pool would test it.
//!
//! What that changes when the server restarts or kills connections: the next statement on a
//! connection that waited here for less than [`WARM_FOR`] fails, as `Unavailable`, as a
//! statement in flight at the restart fails. A connection that failed (or was abandoned in the
//! middle of its work) is never kept: it goes back to the pool, which tests it and drops it if
//! it is gone, and so do all the kept ones, so one statement fails, not one per kept
//! connection. A transaction whose BEGIN fails so (nothing ran yet) starts again on a tested
//! connection and does not fail at all.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool, TransactionManager};

/// How long a connection waits here and is still used untested.
pub const WARM_FOR: Duration = Duration::from_secs(1);

/// The pool and the connections kept from it (cheap to clone: one shared set).
pub struct Warm<DB: Database> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Database> Clone for Warm<DB> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<DB: Database> {
    pool: Pool<DB>,
    idle: Mutex<Vec<(PoolConnection<DB>, Instant)>>,
    keep: usize,
}

impl<DB: Database> Drop for Inner<DB> {
    /// A kept connection dropped goes back to its pool on a task of the runtime, and sqlx
    /// panics when there is none (a store outliving its runtime at the end of a process).
    /// Then each is closed where it is.
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_err() {
            let idle = self.idle.get_mut().unwrap_or_else(PoisonError::into_inner);
            for (conn, _) in idle.drain(..) {
                drop(conn.detach());
            }
        }
    }
}

impl<DB: Database> Warm<DB> {
    /// Keeps at most `keep` connections (the rest of the pool stays for statements on it).
    pub fn new(pool: Pool<DB>, keep: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                idle: Mutex::new(Vec::with_capacity(keep)),
                keep,
            }),
        }
    }

    pub fn pool(&self) -> &Pool<DB> {
        &self.inner.pool
    }

    /// How many connections wait here now.
    pub fn kept(&self) -> usize {
        self.idle().len()
    }

    /// Hands every kept connection back to the pool, which tests them before their next use
    /// (and must have them all back to close).
    pub fn release(&self) {
        self.idle().clear();
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<DB>, Instant)>> {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection used last, if it waited less than [`WARM_FOR`]; else one tested, here
    /// or from the pool.
    pub async fn take(&self) -> Result<Held<DB>, sqlx::Error> {
        loop {
            let next = self.idle().pop();
            match next {
                Some((conn, since)) if since.elapsed() < WARM_FOR => {
                    return Ok(self.held(conn, true));
                }
                Some((mut conn, _)) => {
                    // A broken one goes back to the pool, which drops it.
                    if conn.ping().await.is_ok() {
                        return Ok(self.held(conn, false));
                    }
                }
                None => return self.tested().await,
            }
        }
    }

    /// A connection from the pool, which tests it.
    pub async fn tested(&self) -> Result<Held<DB>, sqlx::Error> {
        let conn = self.inner.pool.acquire().await?;
        Ok(self.held(conn, false))
    }

    fn held(&self, conn: PoolConnection<DB>, untested: bool) -> Held<DB> {
        Held {
            conn: Some(conn),
            warm: self.clone(),
            untested,
        }
    }

    /// A transaction on a kept connection. BEGIN failing on an untested one because the
    /// connection is gone (nothing ran yet) is tried again once on a tested connection.
    pub async fn begin(&self) -> Result<Held<DB>, sqlx::Error> {
        let mut held = self.take().await?;
        match DB::TransactionManager::begin(&mut held, None).await {
            Ok(()) => Ok(held),
            Err(e) if held.untested && connection_lost(&e) => {
                drop(held);
                let mut held = self.tested().await?;
                DB::TransactionManager::begin(&mut held, None).await?;
                Ok(held)
            }
            Err(e) => Err(e),
        }
    }
}

/// The connection itself is gone (closed, reset, or the server ending it), as opposed to a
/// statement's error on a working connection.
pub fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        // 08: connection exception; 57P01-57P03: the server shutting down or starting.
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

/// A connection taken from [`Warm`]: back to it with [`Held::keep`], to the pool when dropped.
pub struct Held<DB: Database> {
    conn: Option<PoolConnection<DB>>,
    warm: Warm<DB>,
    /// Taken from [`Warm`] as it was, without a round trip.
    untested: bool,
}

impl<DB: Database> Held<DB> {
    /// Taken as it waited, without a round trip: the server may have ended it meanwhile.
    pub fn untested(&self) -> bool {
        self.untested
    }

    /// Its work succeeded: the connection waits for the next use. Past `keep` connections it
    /// goes back to the pool.
    pub fn keep(mut self) {
        if DB::TransactionManager::get_transaction_depth(&self) > 0 {
            // Still inside a transaction: dropped, which rolls it back.
            return;
        }
        if let Some(conn) = self.conn.take() {
            let mut idle = self.warm.idle();
            // A closing pool waits for every connection out of it: none is kept from then on.
            if idle.len() < self.warm.inner.keep && !self.warm.inner.pool.is_closed() {
                idle.push((conn, Instant::now()));
            }
        }
    }

    /// Commits the transaction begun by [`Warm::begin`] and keeps the connection. A failed
    /// COMMIT rolls back (as sqlx's own transaction does) and hands the connection to the pool.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        DB::TransactionManager::commit(&mut self).await?;
        self.keep();
        Ok(())
    }
}

impl<DB: Database> Drop for Held<DB> {
    /// Not kept: its statement or transaction failed or was abandoned. The connection goes back
    /// to the pool, which tests it, and so do the kept ones: when the server restarted, they
    /// are all gone, and one failed statement is enough to find that out.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            // Never back to the pool inside a transaction.
            if DB::TransactionManager::get_transaction_depth(conn) > 0 {
                DB::TransactionManager::start_rollback(conn);
            }
            self.warm.release();
        }
    }
}

impl<DB: Database> Deref for Held<DB> {
    type Target = DB::Connection;
    fn deref(&self) -> &DB::Connection {
        self.conn.as_ref().expect("held until kept or dropped")
    }
}

impl<DB: Database> DerefMut for Held<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("held until kept or dropped")
    }
}
