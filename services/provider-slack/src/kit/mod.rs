//! The plumbing a provider kit would share, kept apart from Slack's own code so it can be
//! lifted into core (or a `provider-kit` crate) as it is: the error classes and the
//! retrying call, the leased single consumer per app, ingress admission, and the
//! streaming-delta policy. Nothing here names Slack.

pub(crate) mod admission;
pub(crate) mod delta;
pub(crate) mod lease;
pub(crate) mod retry;
