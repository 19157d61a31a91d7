//! NATS implementation of the Bus
