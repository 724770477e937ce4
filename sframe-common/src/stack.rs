//! Stacks and counts the kernel side keeps for user space.

use crate::budget::MAX_FRAMES;

/// A user stack: frame addresses, innermost first. `frames[0]` is the sampled PC;
/// the others are return addresses (or exact PCs after a signal frame).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    pub len: u32,
    pub _pad: u32,
    pub frames: [u64; MAX_FRAMES],
}

impl Default for UserStack {
    fn default() -> Self {
        Self {
            len: 0,
            _pad: 0,
            frames: [0; MAX_FRAMES],
        }
    }
}

/// Key of the sample counts map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CountKey {
    pub pid: u32,
    pub tid: u32,
    /// Key of the user stack in STACKS (a hash of its frames); 0 = no user stack.
    pub user_stack: u64,
    /// `bpf_get_stackid` result for the kernel stack; negative = none.
    pub kernel_stack: i32,
    /// A `WalkOutcome`.
    pub outcome: u32,
    /// The sampled thread's name (`comm`, NUL-padded) at the time of the sample.
    pub comm: [u8; 16],
}

/// Hash of a stack's frames (FNV-1a over the 8-byte words, with the length folded in).
/// Never 0, so 0 can mean "no stack".
#[inline(always)]
pub const fn mix(hash: u64, word: u64) -> u64 {
    (hash ^ word).wrapping_mul(0x0000_0100_0000_01b3)
}

pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

#[inline(always)]
pub const fn finish(hash: u64, len: u32) -> u64 {
    let h = mix(hash, len as u64);
    if h == 0 { 1 } else { h }
}

/// Frames `bpf_get_stack` may return to the frame-pointer baseline: the kernel's default
/// `perf_event_max_stack`.
pub const BASELINE_FRAMES: usize = 127;

/// One sample of the kernel's frame-pointer walker as `fp_baseline_record` sends it to
/// user space (the bench's accuracy comparison): frames innermost first, `frames[0]` the
/// sampled PC, the others return addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BaselineSample {
    pub pid: u32,
    pub tid: u32,
    /// Frames `bpf_get_stack` returned (0 when it failed).
    pub len: u32,
    pub _pad: u32,
    pub frames: [u64; BASELINE_FRAMES],
}

const _: () = assert!(core::mem::size_of::<CountKey>() == 40);
const _: () = assert!(core::mem::size_of::<BaselineSample>() == 16 + 8 * BASELINE_FRAMES);
const _: () = assert!(core::mem::size_of::<UserStack>() == 8 + 8 * MAX_FRAMES);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: repr(C), integers only, no implicit padding (sizes asserted above).
    unsafe impl aya::Pod for UserStack {}
    unsafe impl aya::Pod for CountKey {}
    unsafe impl aya::Pod for BaselineSample {}
}
