//! Redis implementation of Ephemeral state
