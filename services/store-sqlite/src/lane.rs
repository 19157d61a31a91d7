//! The one writer's turns, handed out first-come within two classes: a short interactive write
//! (a tool call's or an outbound message's idempotency claim) goes before every bulk write
//! that is waiting (the inbound group commit's batches, ack batches, sweeps). SQLite has one
//! writer, so without this an interactive write queues behind whole batches (issue 26 item 5:
//! tool calls at p99 180-260 ms under an inbound flood while the provider answered in 10 ms).
//!
//! A write in progress is never interrupted: an interactive write waits for at most the one
//! transaction holding the writer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Which queue a write waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Goes before every waiting bulk write.
    First,
    Bulk,
}

#[derive(Default)]
struct State {
    busy: bool,
    first: VecDeque<oneshot::Sender<Turn>>,
    bulk: VecDeque<oneshot::Sender<Turn>>,
}

/// The writer's turns.
#[derive(Default)]
pub(crate) struct WriteLane {
    state: Mutex<State>,
}

/// The writer is this holder's until the turn is dropped; then it goes to the next waiter,
/// interactive ones first.
pub(crate) struct Turn {
    lane: Arc<WriteLane>,
    /// False once handed on (or never handed out): dropping it does nothing.
    armed: bool,
}

impl WriteLane {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the writer. Cancel-safe: a turn handed to a waiter that has gone is passed
    /// on when the channel drops it.
    pub(crate) async fn turn(self: &Arc<Self>, class: Class) -> Turn {
        let rx = {
            let mut s = self.lock();
            if !s.busy {
                s.busy = true;
                return Turn {
                    lane: self.clone(),
                    armed: true,
                };
            }
            let (tx, rx) = oneshot::channel();
            match class {
                Class::First => s.first.push_back(tx),
                Class::Bulk => s.bulk.push_back(tx),
            }
            rx
        };
        match rx.await {
            Ok(turn) => turn,
            // Never: the sender is only dropped after a send (a Turn's drop hands it on).
            Err(_) => unreachable!("a waiting turn's sender is dropped only after sending"),
        }
    }

    /// How many writes wait, by class (first, bulk).
    #[cfg(test)]
    fn waiting(&self) -> (usize, usize) {
        let s = self.lock();
        (s.first.len(), s.bulk.len())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut s = self.lane.lock();
        while let Some(next) = s.first.pop_front().or_else(|| s.bulk.pop_front()) {
            let turn = Turn {
                lane: self.lane.clone(),
                armed: true,
            };
            match next.send(turn) {
                Ok(()) => return,
                // That waiter is gone: try the next one.
                Err(mut unsent) => unsent.armed = false,
            }
        }
        s.busy = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_interactive_write_goes_before_waiting_bulk_writes() {
        let lane = Arc::new(WriteLane::default());
        let held = lane.turn(Class::Bulk).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, class) in [
            ("bulk1", Class::Bulk),
            ("bulk2", Class::Bulk),
            ("first", Class::First),
        ] {
            let (waiter, order) = (lane.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _t = waiter.turn(class).await;
                order.lock().unwrap().push(name);
            }));
            // Queue them in this order.
            while lane.waiting().0 + lane.waiting().1 < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["first", "bulk1", "bulk2"]);
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_does_not_keep_the_writer() {
        let lane = Arc::new(WriteLane::default());
        let held = lane.turn(Class::Bulk).await;
        let gone = {
            let lane = lane.clone();
            tokio::spawn(async move { lane.turn(Class::First).await })
        };
        while lane.waiting().0 == 0 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        // The writer is free again: a new turn is had at once.
        let again =
            tokio::time::timeout(std::time::Duration::from_secs(1), lane.turn(Class::Bulk)).await;
        assert!(again.is_ok(), "the writer stayed taken");
    }
}
