//! Telegram updates (webhook bodies and getUpdates results): decoding and text composition
//! never panic, whatever the update holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = switchyard_provider_telegram::fuzzing::update(data);
});
