//! SQLite implementation of the Store (embedded default)
