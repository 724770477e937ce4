//! Types shared by the kernel side (`sframe-ebpf`) and user space (`sframe-user`).
//!
//! Everything that crosses the user/kernel boundary is defined here once: `#[repr(C)]`,
//! `Copy`, fixed width, with explicit padding, so both sides agree byte for byte.
//! The crate is `no_std` and has no dependencies on the kernel side. It also holds the
//! normalized unwind rule that the SFrame reader and the `.eh_frame` deriver both produce.
//!
//! It is not a parser: reading SFrame or DWARF happens in `sframe-user`.
#![no_std]

pub mod budget;
pub mod event;
pub mod layout;
pub mod outcome;
pub mod rule;
pub mod sample;
pub mod stack;
pub mod step;
pub mod window;

pub use outcome::{Counter, WalkOutcome};
pub use rule::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};
pub use sample::RawSample;
