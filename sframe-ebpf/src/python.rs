//! CPython's interpreter frames, appended to a sample's user stack (see
//! `sframe_common::python`): the sampled thread's `PyThreadState` is found in the
//! interpreter's thread list by its native thread id (remembered per thread), and its
//! frame chain is followed for at most `MAX_PY_FRAMES` frames.
//!
//! Everything read here is the process's own memory, which it may have forged: each
//! read is `bpf_probe_read_user` of the sampled process, every loop is bounded, and a
//! forged chain can only misname that process's own frames.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_loop},
    macros::map,
    maps::{HashMap, LruHashMap},
};
use sframe_common::{
    budget::MAX_FRAMES,
    outcome::Counter,
    python::{
        MAX_PY_FRAMES, MAX_PY_PROCESSES, MAX_PY_THREAD_CACHE, MAX_PY_THREADS, NO_OFFSET,
        OWNED_BY_CSTACK, PY_ENTRY, PyProcess, frame_word, thread_key,
    },
    stack::mix,
    step::WalkState,
};

use crate::unwind::count;

/// Python processes: where their runtime is, and their version's offsets.
#[map]
static PY_PROCESSES: HashMap<u32, PyProcess> = HashMap::with_max_entries(MAX_PY_PROCESSES, 0);

/// Thread states by (tgid, tid), as last found (checked again at each use).
#[map]
static PY_THREADS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(MAX_PY_THREAD_CACHE, 0);

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the user address.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

#[inline(always)]
fn read_u8(addr: u64) -> Option<u8> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(addr as *const u8) }.ok()
}

/// What each iteration of the thread search (`bpf_loop`) is handed (on the BPF stack).
#[repr(C)]
struct ThreadLoop {
    /// The thread state to look at next (0: none left).
    ts: u64,
    /// The thread state found (0: none yet).
    found: u64,
    native_id: u64,
    next: u64,
    tid: u64,
}

unsafe extern "C" fn thread_step(_index: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the ThreadLoop on the caller's stack.
    let l = unsafe { &mut *(ctx as *mut ThreadLoop) };
    if l.ts == 0 {
        return 1;
    }
    match read_u64(l.ts.wrapping_add(l.native_id)) {
        Some(id) if id == l.tid => {
            l.found = l.ts;
            return 1;
        }
        Some(_) => {}
        None => return 1,
    }
    match read_u64(l.ts.wrapping_add(l.next)) {
        Some(next) => {
            l.ts = next;
            0
        }
        None => 1,
    }
}

/// The thread state of thread `tid`: the one remembered if it still names the thread,
/// else the first in the main interpreter's list that does.
#[inline(always)]
fn thread_state(py: &PyProcess, tgid: u32, tid: u32) -> Option<u64> {
    let key = thread_key(tgid, tid);
    // SAFETY: map lookup of a plain integer key; the value is copied out.
    if let Some(&ts) = unsafe { PY_THREADS.get(key) }
        && read_u64(ts.wrapping_add(u64::from(py.thread_native_id))) == Some(u64::from(tid))
    {
        return Some(ts);
    }
    let interp = read_u64(py.runtime.wrapping_add(u64::from(py.interpreters_head)))?;
    let mut l = ThreadLoop {
        ts: read_u64(interp.wrapping_add(u64::from(py.threads_head)))?,
        found: 0,
        native_id: u64::from(py.thread_native_id),
        next: u64::from(py.thread_next),
        tid: u64::from(tid),
    };
    // SAFETY: bpf_loop with a static callback and a pointer to the stack.
    unsafe {
        bpf_loop(
            MAX_PY_THREADS,
            thread_step as *mut c_void,
            &mut l as *mut ThreadLoop as *mut c_void,
            0,
        )
    };
    if l.found == 0 {
        return None;
    }
    let _ = PY_THREADS.insert(key, l.found, 0);
    Some(l.found)
}

/// Appends `word` to the stack walked into `st` (while it has room).
#[inline(always)]
fn push(st: &mut WalkState, word: u64) {
    let i = st.stack.len;
    if word == 0 || i as usize >= MAX_FRAMES {
        return;
    }
    st.stack.frames[sframe_common::bounded(i as usize, MAX_FRAMES)] = word;
    st.stack.len = i + 1;
    st.hash = mix(st.hash, word);
    count(Counter::PythonFrames, 1);
}

/// What each iteration of the frame walk (`bpf_loop`) is handed (on the BPF stack).
#[repr(C)]
struct FrameLoop {
    st: *mut WalkState,
    py: PyProcess,
    /// The frame to read next (0: none).
    frame: u64,
    /// The frame read last, recorded once the next one says whether it was an
    /// invocation's first (3.12+: the next is the evaluation loop's own frame).
    pending: u64,
}

unsafe extern "C" fn frame_step(_index: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the FrameLoop on the caller's stack; `st` the per-CPU scratch of
    // the program, valid during the loop.
    let l = unsafe { &mut *(ctx as *mut FrameLoop) };
    let st = unsafe { &mut *l.st };
    let frame = l.frame;
    if frame == 0 {
        return 1;
    }
    let py = &l.py;
    let Some(owner) = read_u8(frame.wrapping_add(u64::from(py.frame_owner))) else {
        return 1;
    };
    if owner == OWNED_BY_CSTACK {
        if l.pending != 0 {
            l.pending |= PY_ENTRY;
        }
    } else {
        push(st, l.pending);
        l.pending = 0;
        let Some(code) = read_u64(frame.wrapping_add(u64::from(py.frame_code))) else {
            return 1;
        };
        let instr = read_u64(frame.wrapping_add(u64::from(py.frame_instr))).unwrap_or(0);
        let first = code.wrapping_add(u64::from(py.code_instructions));
        let offset = if instr >= first {
            (instr - first) / 2
        } else {
            0
        };
        let entry = py.frame_is_entry != NO_OFFSET
            && read_u8(frame.wrapping_add(u64::from(py.frame_is_entry))).unwrap_or(0) != 0;
        l.pending = frame_word(code, offset, entry);
    }
    match read_u64(frame.wrapping_add(u64::from(py.frame_previous))) {
        Some(f) => {
            l.frame = f;
            0
        }
        None => 1,
    }
}

/// Appends the interpreter frames of thread `tid` of process `tgid`, innermost first,
/// to the stack walked into `st`, when the process is a Python process.
#[inline(always)]
pub(crate) fn append_frames(tgid: u32, tid: u32, st: *mut WalkState) {
    // SAFETY: map lookup of a plain integer key; the value is copied out.
    let Some(py) = (unsafe { PY_PROCESSES.get(tgid) }).copied() else {
        return;
    };
    let Some(ts) = thread_state(&py, tgid, tid) else {
        count(Counter::PythonNoThread, 1);
        return;
    };
    let Some(mut frame) = read_u64(ts.wrapping_add(u64::from(py.thread_frame))) else {
        return;
    };
    if py.cframe_current != NO_OFFSET && frame != 0 {
        match read_u64(frame.wrapping_add(u64::from(py.cframe_current))) {
            Some(f) => frame = f,
            None => return,
        }
    }
    let mut l = FrameLoop {
        st,
        py,
        frame,
        pending: 0,
    };
    // SAFETY: bpf_loop with a static callback and a pointer to the stack.
    unsafe {
        bpf_loop(
            MAX_PY_FRAMES,
            frame_step as *mut c_void,
            &mut l as *mut FrameLoop as *mut c_void,
            0,
        )
    };
    // SAFETY: as in `frame_step`.
    push(unsafe { &mut *st }, l.pending);
}
