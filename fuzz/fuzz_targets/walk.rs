//! Fuzz target: the eBPF program's stack walk on arbitrary tables and stacks.
#![no_main]

#[path = "../src/walk_body.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
