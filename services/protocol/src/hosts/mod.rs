//! Wire types and pure rules of "Connector API v1" (seed `004`, draft 0.1.0): the protocol
//! remote agent hosts speak with Switchyard.
//!
//! Everything here is I/O free: messages and their parsing ([`message`]), error codes with
//! their retry policy ([`error`]), the codes of a refused connection or request
//! ([`refusal`]), the timeouts table and reconnect back-off ([`timeouts`]), the run state
//! machine ([`run`]) and the JWT claims a host presents ([`jwt`]).

/// The Card id of the device bridge that exposes agent hosts to xAgent as `device` channels:
/// written once, here, for the provider, the core's hosts service, the pod and the simulator.
pub const AGENT_HOST_CARD_ID: &str = "device.agent-host";

pub mod error;
pub mod jwt;
pub mod message;
pub mod refusal;
pub mod run;
pub mod timeouts;

pub use error::{HostErrorCode, RetryPolicy, RetryStep};
pub use jwt::{ClaimsError, Confirmation, HostClaims, x5t_s256_from_digest};
pub use message::{
    HeartbeatAck, HostMessage, HostProtocolError, MessageType, Peer, format_rfc3339, parse,
    parse_from,
};
pub use refusal::HostRefusalCode;
pub use run::{HostLostPolicy, InvalidTransition, RunFact, RunState, transition};
pub use timeouts::{Timeouts, reconnect_delay};

/// Version of the seed these types follow.
pub const CONNECTOR_API_VERSION: &str = "0.1.0-draft";
