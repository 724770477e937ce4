//! Types shared by the kernel side (`sframe-ebpf`) and user space (`sframe-user`).
//!
//! Everything that crosses the user/kernel boundary is defined here once: `#[repr(C)]`,
//! `Copy`, fixed width, with explicit padding, so both sides agree byte for byte.
//! The crate is `no_std` and has no dependencies on the kernel side. It also holds the
//! normalized unwind rule that the SFrame reader and the `.eh_frame` deriver both produce.
//!
//! It is not a parser: reading SFrame or DWARF happens in `sframe-user`.
#![no_std]
#![deny(missing_docs)]

pub mod budget;
pub mod codec;
pub mod dwarf;
pub mod event;
pub mod layout;
pub mod names;
pub mod offcpu;
pub mod outcome;
pub mod python;
pub mod rule;
pub mod sample;
pub mod stack;
pub mod step;
pub mod window;

pub use outcome::{Counter, WalkOutcome};
pub use rule::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};
pub use sample::RawSample;

/// `v`, through a volatile stack slot: LLVM can no longer see where it came from, so a
/// bound applied to the result (a mask, a comparison) is emitted where the source says,
/// for the verifier to see. libbpf's `barrier_var` does the same in C.
#[inline(always)]
pub fn opaque<T: Copy>(v: T) -> T {
    // SAFETY: a read of a local that is initialized and aligned.
    unsafe { core::ptr::read_volatile(&v) }
}

/// `i` masked into an array of `len` entries (a power of two), with the mask emitted
/// where it stands (see [`opaque`]). The BPF side indexes every array this way: LLVM
/// drops a mask it can prove redundant from an earlier comparison, and the verifiers of
/// older kernels (6.1) do not learn a bound from a comparison of two registers, so the
/// access would be rejected there.
#[inline(always)]
pub fn bounded(i: usize, len: usize) -> usize {
    debug_assert!(len.is_power_of_two());
    opaque(i) & (len - 1)
}

/// A small deterministic generator (xorshift) for the crate's property tests.
#[cfg(test)]
pub(crate) mod test_rng {
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
            from[(self.next() % from.len() as u64) as usize]
        }
    }
}
