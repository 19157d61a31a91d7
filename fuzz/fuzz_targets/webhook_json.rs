//! Generic webhook IM: the JSON body (parse, inline base64 files, validation) never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = switchyard_provider_webhook::fuzzing::json_message(data);
});
