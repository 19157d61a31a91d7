//! Conformance suites: one per trait, run against every implementation.
//! Each backend crate's tests call these with a fresh instance.

pub mod bus;
pub mod ephemeral;
pub mod files;
pub mod hosts;
pub mod store;
