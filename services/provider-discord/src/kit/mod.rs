//! Plumbing a provider kit would share, kept free of Discord so it can be lifted out as is:
//! the error classes of a target call and the retry loop over them ([`retry`]), the leased
//! single consumer per bot across the deployment ([`lease`]) and the streaming-delta policy
//! ([`delta`]). Discord's own rate-limit buckets live in `crate::ratelimit`.

pub(crate) mod delta;
pub(crate) mod lease;
pub(crate) mod retry;
