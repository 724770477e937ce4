//! Fuzz target: open + validate + iterate + lookup + dump + write on arbitrary bytes.
#![no_main]

#[path = "../src/sframe_read_body.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
