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
    bindings::bpf_pidns_info,
    helpers::{
        bpf_probe_read_user,
        generated::{
            bpf_get_ns_current_pid_tgid, bpf_loop, bpf_probe_read_user as bpf_probe_read_user_raw,
        },
    },
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use sframe_common::{
    budget::MAX_FRAMES,
    outcome::Counter,
    python::{
        MAX_PY_FRAMES, MAX_PY_PROCESSES, MAX_PY_THREAD_CACHE, MAX_PY_THREADS, NO_OFFSET,
        OWNED_BY_CSTACK, PY_ENTRY, PY_FLAG_EVERY_ENTRY, PY_FLAG_LASTI, PY_NO_THREAD_STATE,
        PY_UNREAD, PyProcess, frame_word, thread_key,
    },
    stack::mix,
    step::WalkState,
};

use crate::{
    unwind::count,
    walker::{PY_FRAME_CALLS, PY_THREAD_CALLS, Walker, repeat},
};

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

/// The thread id of thread state `ts`, as the process's own PID namespace numbers it:
/// `native_thread_id` (3.11+), or the id in the C library's descriptor its `pthread_t`
/// points to (3.10).
#[inline(always)]
fn thread_id(py: &PyProcess, ts: u64) -> Option<u64> {
    let id = read_u64(ts.wrapping_add(u64::from(py.thread_native_id)))?;
    if py.pthread_tid == NO_OFFSET {
        return Some(id);
    }
    // SAFETY: bpf_probe_read_user checks the user address.
    let tid =
        unsafe { bpf_probe_read_user(id.wrapping_add(u64::from(py.pthread_tid)) as *const u32) }
            .ok()?;
    Some(u64::from(tid))
}

/// The Python walk's state between the iterations of its `bpf_loop`s, in map memory
/// (as the native walk's `WalkState`; on the 6.1 kernel, state kept in a struct on the
/// caller's stack lost the frame loop's writes: only the last frame, pushed after the
/// loop, was recorded).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PyWalk {
    py: PyProcess,
    /// Thread search: the thread state to look at next (0: none left), and the one
    /// found (0: none yet).
    ts: u64,
    found: u64,
    tid: u64,
    /// Frame walk: the frame to read next (0: none), and the frame read last, recorded
    /// once the next one says whether it was an invocation's first (3.12+: the next is
    /// the evaluation loop's own frame).
    frame: u64,
    pending: u64,
    /// The header of the frame being read ([`FRAME_HEADER`] or [`FRAME_OBJECT_HEADER`]
    /// bytes used).
    header: [u8; HEADER_BUF],
}

/// Bytes of a frame read at once: every field the walk reads lies in them.
const FRAME_HEADER: usize = sframe_common::python::FRAME_HEADER as usize;
/// Bytes of a frame object read at once.
const FRAME_OBJECT_HEADER: usize = sframe_common::python::FRAME_OBJECT_HEADER as usize;
/// The header buffer's size: a power of two above both, for masked indexes.
const HEADER_BUF: usize = 128;
const _: () = assert!(FRAME_HEADER <= HEADER_BUF && FRAME_OBJECT_HEADER <= HEADER_BUF);

/// Entry [`PY_WALK_PROFILE`]: `profile`'s; [`PY_WALK_OFF_CPU`]: the off-CPU walker's
/// (which `profile` can interrupt on its CPU).
#[map]
static PY_WALK: PerCpuArray<PyWalk> = PerCpuArray::with_max_entries(2, 0);
/// `profile`'s entry of [`PY_WALK`].
pub(crate) const PY_WALK_PROFILE: u32 = 0;
/// The off-CPU walker's entry of [`PY_WALK`].
pub(crate) const PY_WALK_OFF_CPU: u32 = 1;

/// What `bpf_loop` hands each iteration (on the BPF stack): pointers only.
#[repr(C)]
struct PyLoopCtx {
    st: *mut WalkState,
    walk: *mut PyWalk,
}

unsafe extern "C" fn thread_step(_index: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the PyLoopCtx on the caller's stack; `walk` this CPU's PY_WALK
    // value, valid during the loop.
    let c = unsafe { &*(ctx as *const PyLoopCtx) };
    let w = unsafe { &mut *c.walk };
    if w.ts == 0 {
        return 1;
    }
    match thread_id(&w.py, w.ts) {
        Some(id) if id == w.tid => {
            w.found = w.ts;
            return 1;
        }
        Some(_) => {}
        None => return 1,
    }
    match read_u64(w.ts.wrapping_add(u64::from(w.py.thread_next))) {
        Some(next) => {
            w.ts = next;
            0
        }
        None => 1,
    }
}

/// The thread state of thread `tid` (in `w.found`, 0 if none): the one remembered if it
/// still names the thread, else the first in the main interpreter's list that does.
#[inline(always)]
fn thread_state<W: Walker>(c: &mut PyLoopCtx, tgid: u32, tid: u32, own_tid: u32) -> Option<u64> {
    let key = thread_key(tgid, tid);
    let tid = own_tid;
    // SAFETY: this CPU's PY_WALK value, valid during the program run.
    let w = unsafe { &mut *c.walk };
    // SAFETY: map lookup of a plain integer key; the value is copied out.
    let cached = unsafe { PY_THREADS.get(key) }.copied();
    if let Some(ts) = cached
        && ts & PY_NO_THREAD_STATE == 0
        && thread_id(&w.py, ts) == Some(u64::from(tid))
    {
        return Some(ts);
    }
    let interp = read_u64(w.py.runtime.wrapping_add(u64::from(w.py.interpreters_head)))?;
    let head = read_u64(interp.wrapping_add(u64::from(w.py.threads_head)))?;
    // Searched without finding one while the list began with the same thread state:
    // CPython puts every new thread state at the list's head, so none was added since.
    let none_here = PY_NO_THREAD_STATE | (head & !PY_NO_THREAD_STATE);
    if cached == Some(none_here) {
        return None;
    }
    count(Counter::PythonThreadSearches, 1);
    w.ts = head;
    w.found = 0;
    w.tid = u64::from(tid);
    if W::BPF_LOOP {
        // SAFETY: bpf_loop with a static callback and a pointer to the stack.
        unsafe {
            bpf_loop(
                MAX_PY_THREADS,
                thread_step as *mut c_void,
                c as *mut PyLoopCtx as *mut c_void,
                0,
            )
        };
    } else {
        repeat::<PY_THREAD_CALLS>(W::py_thread);
    }
    // SAFETY: as above.
    let (found, left) = unsafe { ((*c.walk).found, (*c.walk).ts) };
    if found == 0 {
        // Remembered only when the search read the whole list (`ts` 0 at its end): a
        // read that failed or a list longer than the bound says nothing of the thread.
        if left == 0 {
            let _ = PY_THREADS.insert(key, none_here, 0);
        }
        return None;
    }
    let _ = PY_THREADS.insert(key, found, 0);
    Some(found)
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
    if word != PY_UNREAD {
        count(Counter::PythonFrames, 1);
    }
}

unsafe extern "C" fn frame_step(_index: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the PyLoopCtx on the caller's stack; `st` and `walk` per-CPU map
    // values of the program, valid during the loop.
    let c = unsafe { &*(ctx as *const PyLoopCtx) };
    let w = unsafe { &mut *c.walk };
    let st = unsafe { &mut *c.st };
    let frame = w.frame;
    if frame == 0 {
        return 1;
    }
    // The frame's first bytes in one read (every field the walk needs lies there: user
    // space refuses offsets past it), a frame object's more than an interpreter frame's
    // (which can be as short as its header).
    let size = if w.py.flags & PY_FLAG_LASTI != 0 {
        FRAME_OBJECT_HEADER
    } else {
        FRAME_HEADER
    };
    // SAFETY: bpf_probe_read_user checks the user address; `header` holds HEADER_BUF
    // bytes, at least `size`.
    let read = unsafe {
        bpf_probe_read_user_raw(
            w.header.as_mut_ptr().cast(),
            size as u32,
            frame as *const c_void,
        )
    };
    if read != 0 {
        return 1;
    }
    let owner = if w.py.frame_owner == NO_OFFSET {
        0
    } else {
        header_u8(w, w.py.frame_owner)
    };
    if owner == OWNED_BY_CSTACK {
        if w.pending != 0 {
            w.pending |= PY_ENTRY;
        }
    } else {
        push(st, w.pending);
        let code = header_u64(w, w.py.frame_code);
        let offset = if w.py.flags & PY_FLAG_LASTI != 0 {
            // 3.10's `f_lasti`: code units, -1 before the first instruction.
            u64::try_from(header_i32(w, w.py.frame_instr)).unwrap_or(0)
        } else {
            let instr = header_u64(w, w.py.frame_instr);
            let first = code.wrapping_add(u64::from(w.py.code_instructions));
            if instr >= first {
                (instr - first) / 2
            } else {
                0
            }
        };
        let entry = w.py.flags & PY_FLAG_EVERY_ENTRY != 0
            || (w.py.frame_is_entry != NO_OFFSET && header_u8(w, w.py.frame_is_entry) != 0);
        w.pending = if code == 0 {
            0
        } else {
            frame_word(code, offset, entry)
        };
    }
    w.frame = header_u64(w, w.py.frame_previous);
    0
}

/// One iteration of a loop body (`thread_step`, `frame_step`) with the walk state of
/// `scratch` and entry `slot` of [`PY_WALK`], for the walker without `bpf_loop`, which
/// finds them in the maps at each call (see `walker`); false when the loop is over.
#[inline(always)]
fn call(
    scratch: &PerCpuArray<WalkState>,
    slot: u32,
    body: unsafe extern "C" fn(u32, *mut c_void) -> i64,
) -> bool {
    let (Some(st), Some(walk)) = (scratch.get_ptr_mut(0), PY_WALK.get_ptr_mut(slot)) else {
        return false;
    };
    let mut c = PyLoopCtx { st, walk };
    // SAFETY: `c` holds this CPU's map values of the walking program, as `bpf_loop`'s
    // context does.
    unsafe { body(0, &mut c as *mut PyLoopCtx as *mut c_void) == 0 }
}

/// One thread state of the thread search (see [`call`]).
#[inline(always)]
pub(crate) fn thread_call(scratch: &PerCpuArray<WalkState>, slot: u32) -> bool {
    call(scratch, slot, thread_step)
}

/// One frame of the frame walk (see [`call`]).
#[inline(always)]
pub(crate) fn frame_call(scratch: &PerCpuArray<WalkState>, slot: u32) -> bool {
    call(scratch, slot, frame_step)
}

/// The 8-byte field at `offset` of the frame header just read (8-aligned offsets; the
/// mask keeps the read inside the buffer whatever the offset).
#[inline(always)]
fn header_u64(w: &PyWalk, offset: u32) -> u64 {
    let i = sframe_common::bounded(offset as usize, HEADER_BUF) & (HEADER_BUF - 8);
    // SAFETY: `i + 8 <= HEADER_BUF`, 8-aligned in the map value.
    unsafe { core::ptr::read_unaligned(w.header.as_ptr().add(i).cast::<u64>()) }
}

/// The 4-byte signed field at `offset` of the frame header just read (4-aligned
/// offsets).
#[inline(always)]
fn header_i32(w: &PyWalk, offset: u32) -> i32 {
    let i = sframe_common::bounded(offset as usize, HEADER_BUF) & (HEADER_BUF - 4);
    // SAFETY: `i + 4 <= HEADER_BUF`, 4-aligned in the map value.
    unsafe { core::ptr::read_unaligned(w.header.as_ptr().add(i).cast::<i32>()) }
}

/// The byte at `offset` of the frame header just read.
#[inline(always)]
fn header_u8(w: &PyWalk, offset: u32) -> u8 {
    w.header[sframe_common::bounded(offset as usize, HEADER_BUF)]
}

/// Interpreter frame words to send with a deferred sample: `len` words from index
/// `first` of the user stack `frames` (null: none); `unread` when the walk could not
/// read the whole chain (the words end with [`PY_UNREAD`]).
pub(crate) struct PyWords {
    pub(crate) frames: *const u64,
    pub(crate) first: u32,
    pub(crate) len: u32,
    pub(crate) unread: bool,
}

/// Appends the interpreter frames of thread `tid` of process `tgid`, innermost first,
/// to the stack walked into `scratch` (a per-CPU walk state, entry 0), when the process
/// is a Python process, using entry `slot` of [`PY_WALK`]; returns them (for a deferred
/// record).
#[inline(always)]
pub(crate) fn append_frames<W: Walker>(
    scratch: &PerCpuArray<WalkState>,
    tgid: u32,
    tid: u32,
    slot: u32,
) -> PyWords {
    let mut py = PyWords {
        frames: core::ptr::null(),
        first: 0,
        len: 0,
        unread: false,
    };
    let Some(st) = scratch.get_ptr_mut(0) else {
        return py;
    };
    // SAFETY: this CPU's walk state of the calling program, walked into before.
    let first = unsafe { (*st).stack.len };
    py.unread = walk_frames::<W>(tgid, tid, st, slot);
    // SAFETY: as above.
    unsafe {
        py.len = (*st).stack.len.wrapping_sub(first);
        py.first = first;
        py.frames = (*st).stack.frames.as_ptr();
    }
    py
}

/// Appends the interpreter frames of thread `tid` of process `tgid`, innermost first,
/// to the stack walked into `st`, when the process is a Python process; true when the
/// thread's frame chain could not all be read (then [`PY_UNREAD`] ends them).
#[inline(always)]
fn walk_frames<W: Walker>(tgid: u32, tid: u32, st: *mut WalkState, slot: u32) -> bool {
    // SAFETY: map lookup of a plain integer key; the value is copied out.
    let Some(py) = (unsafe { PY_PROCESSES.get(tgid) }).copied() else {
        return false;
    };
    let Some(walk) = PY_WALK.get_ptr_mut(slot) else {
        return false;
    };
    // SAFETY: this CPU's PY_WALK value; no other program on this CPU uses it meanwhile.
    unsafe { (*walk).py = py };
    // The thread's id as CPython recorded it: in its own PID namespace.
    let own_tid = if py.pidns_ino != 0 {
        let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
        // SAFETY: the helper writes `size_of::<bpf_pidns_info>()` bytes into `ns`.
        let r = unsafe {
            bpf_get_ns_current_pid_tgid(
                py.pidns_dev,
                py.pidns_ino,
                &mut ns,
                core::mem::size_of::<bpf_pidns_info>() as u32,
            )
        };
        if r != 0 {
            count(Counter::PythonNoThread, 1);
            return false;
        }
        ns.pid
    } else {
        tid
    };
    let mut c = PyLoopCtx { st, walk };
    let Some(ts) = thread_state::<W>(&mut c, tgid, tid, own_tid) else {
        count(Counter::PythonNoThread, 1);
        return false;
    };
    let Some(mut frame) = read_u64(ts.wrapping_add(u64::from(py.thread_frame))) else {
        // SAFETY: `st` is the caller's walk state (see `append_frames`).
        unsafe { push(&mut *st, PY_UNREAD) };
        return true;
    };
    if py.cframe_current != NO_OFFSET && frame != 0 {
        match read_u64(frame.wrapping_add(u64::from(py.cframe_current))) {
            Some(f) => frame = f,
            None => {
                // SAFETY: as above.
                unsafe { push(&mut *st, PY_UNREAD) };
                return true;
            }
        }
    }
    // SAFETY: as above.
    unsafe {
        (*walk).frame = frame;
        (*walk).pending = 0;
    }
    if W::BPF_LOOP {
        // SAFETY: bpf_loop with a static callback and a pointer to the stack.
        unsafe {
            bpf_loop(
                MAX_PY_FRAMES,
                frame_step as *mut c_void,
                &mut c as *mut PyLoopCtx as *mut c_void,
                0,
            )
        };
    } else {
        repeat::<PY_FRAME_CALLS>(W::py_frame);
    }
    // SAFETY: as in `frame_step`; the loop is over.
    let (st, pending, left) = unsafe { (&mut *st, (*walk).pending, (*walk).frame) };
    push(st, pending);
    // A frame left to read: one could not be read, or the bound was reached.
    if left != 0 {
        push(st, PY_UNREAD);
        return true;
    }
    false
}
