//! Wire types of the xAgent Connector Common Protocol 3.0 and its profiles.
//!
//! Everything here is pure: parsing, building and validating packets, Cards and
//! Descriptors. No I/O, no storage, no sockets.

pub mod card;
pub mod descriptor;
pub mod envelope;
pub mod error;
pub mod hosts;
pub mod im;
pub mod outbound;
pub mod packet;
pub mod profile;

pub use card::{AuthField, AuthFlow, AuthFlowType, BuildInfo, Card, CardTool};
pub use descriptor::{ConnectionStatus, Descriptor, ToolState, ToolStatus};
pub use envelope::{Envelope, ErrorBody};
pub use error::ErrorCode;
pub use outbound::{Correlation, Outbound};
pub use packet::{Inbound, PacketError, RequestMeta};

/// Protocol version this implementation speaks and declares.
pub const PROTOCOL_VERSION: &str = "3.0";
/// Card schema identifier.
pub const CARD_SCHEMA: &str = "xagent.connector/v1";
/// Descriptor schema identifier.
pub const DESCRIPTOR_SCHEMA: &str = "xagent.connection/v2";
/// Packet schema identifier.
pub const PACKET_SCHEMA: &str = "xagent.connector.packet/v1";
/// WebSocket subprotocol of the data plane.
pub const SUBPROTOCOL: &str = "xagent.connector.packet.v1";

/// Target types known to protocol 3.0.
pub const TARGET_TYPES: [&str; 5] = ["im", "email", "calendar", "ticket", "device"];

/// Parses a `major.minor` protocol version; a missing minor counts as `.0`.
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.trim().splitn(2, '.');
    let major = it.next()?.parse().ok()?;
    let minor = match it.next() {
        Some(m) => m.parse().ok()?,
        None => 0,
    };
    Some((major, minor))
}

/// True when `v` is a version this server admits (3.0 and later within major 3+).
pub fn version_admitted(v: &str) -> bool {
    matches!(parse_version(v), Some((major, _)) if major >= 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert!(version_admitted("3.0"));
        assert!(version_admitted("3.1"));
        assert!(version_admitted("4"));
        assert!(!version_admitted("2.9"));
        assert!(!version_admitted(""));
        assert!(!version_admitted("abc"));
    }
}
