//! Generic webhook IM: the multipart part scanner that bounds preambles and part headers
//! before the signature is known. The first byte picks the chunk size, so delimiters split
//! across reads are exercised; the same body in one piece must get the same verdict.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_provider_webhook::fuzzing::multipart;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(first % 64) + 1;
    let split = multipart("b0undary", body, chunk);
    let whole = multipart("b0undary", body, body.len().max(1));
    assert_eq!(split, whole, "verdict depends on chunking (chunk {chunk})");
});
