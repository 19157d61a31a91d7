//! Admission and refusal forms: which packets the tenant's request quota counts, the
//! per-socket bounds, and the one shape of each refusal (an `error` packet, a rejected
//! `chat.message.ack` that says whether a retry may succeed, a failed `tool.invoke.ack`).

use switchyard_protocol::im::ChatAckPayload;
use switchyard_protocol::outbound::{Correlation, Outbound};
use switchyard_protocol::packet::{Inbound, RequestMeta};
use switchyard_protocol::{Envelope, ErrorCode};

use super::{Session, SessionStep};
use crate::engine::{Fault, retryable};
use crate::ids::{new_id, now_ms};

/// The requests a tenant's rate quota counts: those that start work. Acks, deltas,
/// activity, closes and pings are not counted (refusing them would only add work).
pub(super) fn is_work(pkt: &Inbound) -> bool {
    matches!(
        pkt,
        Inbound::ChannelOpen
            | Inbound::AuthStart(_)
            | Inbound::AuthStatus(_)
            | Inbound::AuthCancel(_)
            | Inbound::AuthLogout
            | Inbound::ToolInvoke(_)
            | Inbound::ChatMessage(_)
            | Inbound::ChatDelta(_)
            | Inbound::DescriptorGet
    )
}

/// An answer to `meta` (on its channel unless the packet names another).
pub(super) fn answer(meta: &RequestMeta, o: Outbound) -> Envelope {
    o.into_envelope(new_id("pkt"), now_ms(), Correlation::answer(meta))
}

/// An answer to `meta` on `channel`.
pub(super) fn answer_on(meta: &RequestMeta, channel: &str, o: Outbound) -> Envelope {
    o.into_envelope(
        new_id("pkt"),
        now_ms(),
        Correlation::answer(meta).on_channel(channel),
    )
}

pub(super) fn error_packet(meta: &RequestMeta, fault: Fault) -> Envelope {
    answer(
        meta,
        Outbound::Error {
            code: fault.code,
            message: fault.message,
        },
    )
}

/// A rejected `chat.message.ack`, retryable by the one rule.
pub(super) fn rejected_ack(
    meta: &RequestMeta,
    channel: &str,
    message_id: &str,
    f: &Fault,
) -> Envelope {
    let ack = ChatAckPayload::rejected(message_id, f.code.as_str(), &f.message, retryable(f.code));
    answer_on(meta, channel, Outbound::ChatAck(ack))
}

pub(super) fn fault_pair(f: Fault) -> (ErrorCode, String) {
    (f.code, f.message)
}

/// The refusal of work to a draining socket.
pub(super) fn draining() -> Fault {
    Fault::new(ErrorCode::Draining, "server draining; reconnect")
}

impl Session {
    /// The tenant's request quota, for packets that start work.
    pub(super) fn admit(&self, tenant_id: &str, pkt: &Inbound) -> Result<(), Fault> {
        if is_work(pkt) {
            self.conn.hub.quotas.admit_request(tenant_id)?;
        }
        Ok(())
    }

    /// A frame over the packet size bound.
    pub(super) fn oversize(&self, text: &str) -> Option<Fault> {
        (text.len() > self.limits.max_frame_bytes).then(|| {
            Fault::new(
                ErrorCode::PacketTooLarge,
                format!("frame exceeds {} bytes", self.limits.max_frame_bytes),
            )
        })
    }

    /// A slot for an auth request, or the `busy` refusal.
    pub(super) fn admit_auth(&mut self) -> Result<(), Fault> {
        if self.auths_running >= self.limits.auth_per_socket.max(1) {
            metrics::counter!("switchyard_limits_hit_total", "limit" => "auth_per_socket")
                .increment(1);
            return Err(Fault::new(
                ErrorCode::Busy,
                format!(
                    "too many auth requests in flight on this socket (limits.auth_per_socket = {}); retry",
                    self.limits.auth_per_socket
                ),
            ));
        }
        self.auths_running += 1;
        Ok(())
    }

    /// A slot for a tool call, or the refusal (draining, or `busy`).
    pub(super) fn admit_tool(&mut self) -> Result<(), Fault> {
        if self.draining {
            return Err(Fault::new(
                ErrorCode::Draining,
                "server draining; retry on the reconnected socket",
            ));
        }
        if self.tools_running >= self.limits.tools_per_socket {
            return Err(Fault::new(
                ErrorCode::Busy,
                "too many concurrent tool calls on this socket; retry",
            ));
        }
        self.tools_running += 1;
        Ok(())
    }

    /// A work request refused before it started (a tenant's rate): a tool call gets its
    /// tool ack and a chat.message its rejected ack, so xAgent's state resolves either way.
    pub(super) fn refuse_work(
        &self,
        meta: &RequestMeta,
        pkt: &Inbound,
        f: Fault,
        step: &mut SessionStep,
    ) {
        match pkt {
            Inbound::ToolInvoke(p) => {
                let chid = meta.connector_channel_id.as_deref().unwrap_or_default();
                let ack = Outbound::ToolAck {
                    tool_id: p.tool_id.clone(),
                    result: Err(fault_pair(f)),
                };
                step.packet(answer_on(meta, chid, ack));
            }
            _ => reply_fault(meta, pkt, f, step),
        }
    }
}

/// Ownership/route failures of a chat.message are answered with a rejected ack as well,
/// so xAgent's sender state resolves; everything else gets an `error` packet.
pub(super) fn reply_fault(meta: &RequestMeta, pkt: &Inbound, f: Fault, step: &mut SessionStep) {
    if let Inbound::ChatMessage(m) = pkt {
        let chid = meta.connector_channel_id.as_deref().unwrap_or_default();
        let ack = rejected_ack(meta, chid, &m.message_id, &f);
        step.packet(error_packet(meta, f));
        step.packet(ack);
    } else {
        step.packet(error_packet(meta, f));
    }
}
