//! The configuration loader: any TOML text gives a config or a clear error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = switchyard::config::Config::from_toml_str(text);
});
