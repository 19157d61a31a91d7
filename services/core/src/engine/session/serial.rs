//! The per-channel serial order of xAgent -> target work: each channel has a lane, one item
//! runs at a time in arrival order, up to `channel_queue` wait behind it, and more is
//! refused (`busy`, or `draining` on a draining socket). Each item re-reads the channel, so
//! a status change (logout, revocation) applies to the next message at once.

use std::collections::VecDeque;

use switchyard_protocol::ErrorCode;
use switchyard_protocol::im::{ActivityPayload, ChatMessagePayload, DeltaPayload};
use switchyard_protocol::outbound::Outbound;
use switchyard_protocol::packet::RequestMeta;

use super::admission::{answer_on, error_packet, rejected_ack};
use super::{Done, Finished, Session, SessionStep, panicked};
use crate::engine::{Fault, MountedCard};

/// Work for a channel's lane (xAgent -> target, in arrival order).
#[derive(Debug)]
pub(super) enum ChannelWork {
    Message(RequestMeta, ChatMessagePayload),
    Delta(RequestMeta, DeltaPayload),
    Activity(ActivityPayload),
}

/// One channel's serial work: whether an item runs, and what waits behind it.
#[derive(Debug, Default)]
pub(super) struct Lane {
    running: bool,
    waiting: VecDeque<ChannelWork>,
}

impl Session {
    /// Queues work on its channel's lane, or refuses it when the lane is full or the socket
    /// drains.
    pub(super) fn enqueue_work(&mut self, chid: &str, work: ChannelWork, step: &mut SessionStep) {
        // A draining socket starts no new work (it would keep the drain waiting); the work
        // is refused retryably and xAgent sends it again on its next socket.
        let refused = if self.draining {
            Some(work)
        } else {
            let lane = self.lanes.entry(chid.to_owned()).or_default();
            if !lane.running {
                lane.running = true;
                self.run_serial(chid, work, step);
                None
            } else if lane.waiting.len() < self.limits.channel_queue {
                lane.waiting.push_back(work);
                None
            } else {
                Some(work)
            }
        };
        let Some(work) = refused else {
            return;
        };
        let f = if self.draining {
            Fault::new(
                ErrorCode::Draining,
                "server draining; send it again after reconnecting",
            )
        } else {
            Fault::new(ErrorCode::Busy, "channel queue is full; retry later")
        };
        match work {
            ChannelWork::Message(meta, p) => {
                step.packet(rejected_ack(&meta, chid, &p.message_id, &f))
            }
            ChannelWork::Delta(meta, _) => step.packet(error_packet(&meta, f)),
            // Activity is a best-effort snapshot: dropping one is harmless.
            ChannelWork::Activity(_) => {}
        }
    }

    /// A lane's item finished: the next one starts, or the lane goes when it is empty or
    /// its channel no longer exists.
    pub(super) fn next_serial(&mut self, chid: &str, gone: bool, step: &mut SessionStep) {
        let next = match self.lanes.get_mut(chid) {
            Some(lane) if !gone => lane.waiting.pop_front(),
            _ => None,
        };
        match next {
            Some(work) => self.run_serial(chid, work, step),
            None => {
                self.lanes.remove(chid);
            }
        }
    }

    fn run_serial(&mut self, chid: &str, work: ChannelWork, step: &mut SessionStep) {
        let conn = self.conn.clone();
        let chid = chid.to_owned();
        // A panic answers the item as a failure, and the lane goes on with the next one.
        let if_panicked = Finished::Serial {
            channel: chid.clone(),
            answer: match &work {
                ChannelWork::Message(meta, p) => {
                    Some(rejected_ack(meta, &chid, &p.message_id, &panicked()))
                }
                ChannelWork::Delta(meta, _) => Some(error_packet(meta, panicked())),
                ChannelWork::Activity(_) => None,
            },
            gone: false,
        };
        let item = async move {
            let (answer, gone) = serial_item(&conn, &chid, work).await;
            Done(Box::new(Finished::Serial {
                channel: chid,
                answer,
                gone,
            }))
        };
        self.work(step, item, if_panicked);
    }
}

/// One item of a lane: the channel as stored now, then the target. Returns the answer, if
/// any, and whether the channel is gone.
async fn serial_item(
    conn: &MountedCard,
    chid: &str,
    work: ChannelWork,
) -> (Option<switchyard_protocol::Envelope>, bool) {
    // Re-read the channel so status changes (logout, revocation) apply immediately.
    let ch = match conn.hub.store.get_channel(chid).await {
        Ok(Some(ch)) => ch,
        Ok(None) => return (None, true),
        Err(e) => {
            tracing::warn!(error = %e, "store unavailable in channel worker");
            let answer = match work {
                ChannelWork::Message(meta, p) => {
                    let f = Fault::new(ErrorCode::Unavailable, "store unavailable; retry later");
                    Some(rejected_ack(&meta, chid, &p.message_id, &f))
                }
                _ => None,
            };
            return (answer, false);
        }
    };
    let answer = match work {
        ChannelWork::Message(meta, p) => match crate::trace::traced(
            &conn.hub.tracer,
            "switchyard.chat.message",
            vec![
                ("switchyard.channel_id", chid.to_owned()),
                ("switchyard.message_id", p.message_id.clone()),
            ],
            conn.receive_message(&ch, &p),
            |r| r.as_ref().err().map(|f| f.code.to_string()),
        )
        .await
        {
            Ok(Some(ack)) => Some(answer_on(&meta, chid, Outbound::ChatAck(ack))),
            Ok(None) => None,
            Err(f) => Some(rejected_ack(&meta, chid, &p.message_id, &f)),
        },
        ChannelWork::Delta(meta, p) => match conn.receive_delta(&ch, &p).await {
            Ok(()) => None,
            Err(f) => Some(error_packet(&meta, f)),
        },
        ChannelWork::Activity(p) => {
            conn.receive_activity(&ch, &p).await;
            None
        }
    };
    (answer, false)
}
