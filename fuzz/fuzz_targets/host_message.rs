//! Connector API v1 messages from agent hosts: parsing never panics, and whatever parses
//! serialises back into a message that parses again, as the same type of message (values
//! are not compared: serde_json's default float parsing is not an exact round trip).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_protocol::hosts::message::{Peer, parse, parse_from};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_from(Peer::Host, text);
    let _ = parse_from(Peer::Server, text);
    if let Ok(m) = parse(text) {
        let again = parse(&m.to_json()).expect("a parsed message serialises to a valid one");
        assert_eq!(again.message_type(), m.message_type());
        assert_eq!(again.run_id(), m.run_id());
    }
});
