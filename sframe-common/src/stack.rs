//! Stacks and counts the kernel side keeps for user space.

use crate::budget::MAX_FRAMES;

/// A user stack: frame addresses, innermost first. `frames[0]` is the sampled PC;
/// the others are return addresses, or exact PCs after a signal frame, stored with
/// [`FRAME_EXACT`] set ([`frame_pc`], [`lookup_address`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    /// Number of valid entries at the start of `frames`.
    pub len: u32,
    /// Explicit padding; zero.
    pub _pad: u32,
    /// Frame words, innermost first; the first `len` are valid.
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

/// Set in a caller frame's word when its PC is exact (restored from a signal frame: the
/// interrupted PC of the code the signal arrived in), not a return address. No user
/// address has bit 63 (x86-64 user space ends below 2^47, AArch64's below 2^52, and the
/// walk cuts pointer-authentication bits off return addresses).
pub const FRAME_EXACT: u64 = 1 << 63;

/// The PC of a user stack's frame word.
#[inline(always)]
pub const fn frame_pc(word: u64) -> u64 {
    word & !FRAME_EXACT
}

/// The address to look up (symbolize, or find a rule for) for the user frame word at
/// `index` (innermost 0): the sampled PC and exact PCs as they are, a return address
/// minus one, which lies in the call instruction (a call to a function that does not
/// return can be the last instruction of its caller, so the return address itself may
/// already belong to the next function). The walker and the symbolizer both use it.
#[inline(always)]
pub const fn lookup_address(index: usize, word: u64) -> u64 {
    if index == 0 || word & FRAME_EXACT != 0 {
        frame_pc(word)
    } else {
        word.wrapping_sub(1)
    }
}

/// Key of the sample counts map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CountKey {
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
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

/// Initial value of a stack hash (the 64-bit FNV offset basis), fed each frame word with
/// [`mix`].
pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// Completes a stack hash: folds in the frame count `len`, and maps 0 to 1 (so a stack
/// key is never 0).
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
    /// Process id (thread-group id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Frames `bpf_get_stack` returned (0 when it failed).
    pub len: u32,
    /// Explicit padding; zero.
    pub _pad: u32,
    /// Frame addresses, innermost first; the first `len` are valid.
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
