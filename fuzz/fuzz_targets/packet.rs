//! xAgent `/ws` text frames: parsing never panics, and a refusal never echoes more than a
//! short prefix of the input (the reply goes back over the same socket).
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_protocol::packet::{MAX_ECHO, MAX_ECHO_ID, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = parse(text) {
        assert!(e.message.len() <= MAX_ECHO + '…'.len_utf8(), "echo of {} bytes", e.message.len());
        let m = &e.meta;
        for id in [Some(&m.packet_id), m.request_id.as_ref(), m.reply_to.as_ref()]
            .into_iter()
            .flatten()
        {
            assert!(id.len() <= MAX_ECHO_ID);
        }
    }
});
