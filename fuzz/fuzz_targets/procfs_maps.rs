//! Fuzz target: the `/proc/PID/maps` parser on arbitrary bytes.
#![no_main]

#[path = "../src/procfs_maps_body.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
