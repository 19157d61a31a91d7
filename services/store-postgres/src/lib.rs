//! Postgres implementation of the Store (cluster)
