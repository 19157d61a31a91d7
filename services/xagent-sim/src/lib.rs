//! xAgent simulator: a real protocol client for tests and the loadtest
