//! How a walk iterates: with `bpf_loop` (Linux 5.17), or, on the kernels before it, with
//! a bounded loop that calls one global function per iteration.
//!
//! The verifier checks a loop's body once per iteration it can run; the frame step,
//! with its binary searches, is far too large for 257 copies. `bpf_loop` has the
//! verifier check its callback once. A *global* function (BTF linkage `global`, Linux
//! 5.6) is checked once too, apart from its callers, with only its argument types
//! known: a loop that calls it costs the verifier a few instructions per iteration. Its
//! arguments can only be scalars (pointers to memory from Linux 5.12), so each function
//! finds its program's per-CPU state in the maps itself, and the native step looks up
//! the process's tables at every frame. Both walkers run the same step functions
//! (`sframe_common::step::walk_step`, `python::thread_step`, `python::frame_step`) on the same
//! state; only the iteration differs.

use sframe_common::python::{MAX_PY_FRAMES, MAX_PY_THREADS};

use crate::{
    python::{self, PY_WALK_PROFILE},
    unwind::{self, INDEX_SLOT_PROFILE},
};

/// A program's way of iterating its walks.
pub(crate) trait Walker {
    /// Iterations run by `bpf_loop`; the functions below are then never called.
    const BPF_LOOP: bool;
    /// One native frame of process `tgid`; false when the walk is over.
    fn native_frame(tgid: u32) -> bool;
    /// One thread state of the Python thread search; false when it is over.
    fn py_thread() -> bool;
    /// One Python frame; false when the chain's walk is over.
    fn py_frame() -> bool;
}

/// Runs `f` until it returns false, at most `n` times (`N`: the bound the verifier
/// sees).
#[inline(always)]
pub(crate) fn repeat<const N: u32>(mut f: impl FnMut() -> bool) {
    let mut i = 0;
    while i < N {
        if !f() {
            break;
        }
        i += 1;
    }
}

/// The native walk's bound of calls: one per frame and the last, which ends it.
pub(crate) const NATIVE_CALLS: u32 = sframe_common::budget::MAX_FRAMES as u32 + 1;
/// The Python thread search's bound of calls.
pub(crate) const PY_THREAD_CALLS: u32 = MAX_PY_THREADS;
/// The Python frame walk's bound of calls.
pub(crate) const PY_FRAME_CALLS: u32 = MAX_PY_FRAMES;

/// Iterations by `bpf_loop`.
pub(crate) struct Looped;

impl Walker for Looped {
    const BPF_LOOP: bool = true;
    #[inline(always)]
    fn native_frame(_tgid: u32) -> bool {
        false
    }
    #[inline(always)]
    fn py_thread() -> bool {
        false
    }
    #[inline(always)]
    fn py_frame() -> bool {
        false
    }
}

/// `profile_bounded`'s iterations: calls of the global functions below.
pub(crate) struct ProfileCalls;

impl Walker for ProfileCalls {
    const BPF_LOOP: bool = false;
    #[inline(always)]
    fn native_frame(tgid: u32) -> bool {
        sframe_profile_frame(tgid) != 0
    }
    #[inline(always)]
    fn py_thread() -> bool {
        sframe_profile_py_thread() != 0
    }
    #[inline(always)]
    fn py_frame() -> bool {
        sframe_profile_py_frame() != 0
    }
}

/// One native frame of `profile_bounded`'s walk (1: go on; 0: the walk is over).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sframe_profile_frame(tgid: u32) -> i64 {
    i64::from(unwind::native_frame(
        &unwind::SCRATCH,
        &unwind::WINDOW,
        INDEX_SLOT_PROFILE,
        tgid,
    ))
}

/// One thread state of `profile_bounded`'s Python thread search (1: go on).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sframe_profile_py_thread() -> i64 {
    i64::from(python::thread_call(&unwind::SCRATCH, PY_WALK_PROFILE))
}

/// One Python frame of `profile_bounded`'s walk (1: go on).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn sframe_profile_py_frame() -> i64 {
    i64::from(python::frame_call(&unwind::SCRATCH, PY_WALK_PROFILE))
}
