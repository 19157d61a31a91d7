//! xAgent simulator: a real protocol client for tests and the loadtest.
//!
//! [`Sim`] plays the xAgent backend against one Connector Base URL: the Control and Transfer
//! Planes over HTTP, and [`Conn`], one `/ws` data-plane connection that correlates answers,
//! queues pushes and checks every received packet against the protocol's JSON Schemas
//! ([`schemas`]). Tests finish with `assert!(sim.schema_violations().is_empty())`.
//!
//! [`host`] is the other side of the device bridge: a simulated host agent (Connector API
//! v1) that enrolls, connects to a pod's mTLS listener and speaks the host protocol.
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchyard_xagent_sim::SimError> {
//! use switchyard_xagent_sim::{EnvelopeExt, Sim};
//! let sim = Sim::new("http://127.0.0.1:8080/webhook", Some("key"))?;
//! let card = sim.card().await?;
//! let conn = sim.connect().await?;
//! conn.hello(card["connector_card_id"].as_str().unwrap_or_default(), None, &["xagent.im.v2"])
//!     .await?
//!     .expect_kind("connector.hello.ack")?;
//! let open = conn.open_channel(None).await?.expect_kind("channel.open.ack")?;
//! assert!(open.connector_channel_id.is_some());
//! assert!(sim.schema_violations().is_empty());
//! # Ok(()) }
//! ```

mod conn;
mod error;
pub mod host;
mod im;
mod packet;
pub mod schemas;
mod sim;

pub use conn::{ABNORMAL_CLOSE, Conn, NO_STATUS_CLOSE};
pub use error::{Result, SimError};
pub use im::{AutoAck, Deliveries, new_message_id};
pub use packet::{EnvelopeExt, new_id, now_ms, packet, request_packet};
pub use sim::{CHANNEL_HEADER, DEFAULT_REQUEST_TIMEOUT, Sim};
pub use switchyard_protocol::Envelope;
pub use switchyard_protocol::im::{AckStatus, ActivityStatus};
