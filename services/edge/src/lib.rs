//! The Switchyard edge pod: configuration, HTTP routes, WebSocket sessions, background
//! loops and the drain. `main.rs` only parses the command line and calls [`app::run`]
//! ([`app::App`] is the composition root).

pub mod app;
pub mod check;
pub mod cli;
mod cluster;
pub mod config;
pub mod console;
mod doorbells;
pub mod download;
pub mod host_ws;
pub mod hosts;
pub mod http;
pub mod journal;
pub mod listener;
pub mod operators;
pub mod otel;
pub mod providers;
pub mod readiness;
pub mod sendq;
pub mod session;
pub mod telemetry;

pub use app::{App, run};
pub use config::Config;
