//! The `HostStore` statements both dialects run as they are, one function per method over
//! the backend's [`Handles`](crate::Handles).

mod approvals;
mod hosts;
mod runs;

pub use approvals::*;
pub use hosts::*;
pub use runs::*;
