//! Fuzz target: arbitrary ELF bytes → CFI rows (`derive_from_elf`) and the per-object
//! table choice (`table_for_elf`).
#![no_main]

#[path = "../src/ehframe_derive_body.rs"]
mod body;

libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));
