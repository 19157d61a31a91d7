//! Conformance suite (to be filled).
