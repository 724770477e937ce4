//! The `profile` program: walks the user stack of each sample with the SFrame-style
//! tables user space loaded, and counts (stack, kernel stack, outcome) per thread.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_NOEXIST, pt_regs},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user,
        generated::{bpf_loop, bpf_probe_read_user as bpf_probe_read_user_raw},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{PerfEventContext, tracing::StackIdContext},
};
use sframe_common::{
    budget::{
        DEFERRED_RING_BYTES, MAX_COUNTS, MAX_FRAMES, MAX_KERNEL_STACKS, MAX_MAPPINGS, MAX_OBJECTS,
        MAX_PAGES, MAX_PROCESSES, MAX_ROWS, MAX_RULES, MAX_STACKS,
    },
    layout::{
        MappingEntry, ObjectEntry, PAGE_BLOCK, PageBlock, ProcessEntry, ROW_BLOCK, RowBlock,
        RowEntry, RuleEntry,
    },
    outcome::{Counter, WalkOutcome},
    python::MAX_PY_FRAMES,
    sample::{DEFERRED_PAGE, DEFERRED_PAGES, DeferredSample},
    stack::{CountKey, UserStack},
    step::{SearchCells, Tables, WalkState, search_narrow_in, walk_step},
    window::{StackWindow, WINDOW_BYTES},
};

use crate::{
    is_target, lifecycle,
    regs::{self, RegsSource},
    walker::{NATIVE_CALLS, Walker, repeat},
};

/// `errno` of a `BPF_NOEXIST` insert whose key exists (Linux, every architecture).
pub(crate) const EEXIST: i32 = 17;

#[map]
pub(crate) static PROCESSES: HashMap<u32, ProcessEntry> =
    HashMap::with_max_entries(MAX_PROCESSES, 0);
#[map]
static OBJECTS: Array<ObjectEntry> = Array::with_max_entries(MAX_OBJECTS, 0);
#[map]
static PAGES: Array<PageBlock> =
    Array::with_max_entries(MAX_PAGES / PAGE_BLOCK as u32, BPF_F_MMAPABLE);
#[map]
static ROWS: Array<RowBlock> = Array::with_max_entries(MAX_ROWS / ROW_BLOCK as u32, BPF_F_MMAPABLE);
#[map]
static RULES: Array<RuleEntry> = Array::with_max_entries(MAX_RULES, 0);

#[map]
pub(crate) static SCRATCH: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);
/// The window of user stack the walk reads from (see `sframe_common::window`).
#[map]
pub(crate) static WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static STACKS: HashMap<u64, UserStack> = HashMap::with_max_entries(MAX_STACKS, 0);
#[map]
static COUNTS: HashMap<CountKey, u64> = HashMap::with_max_entries(MAX_COUNTS, 0);
#[map]
static KERNEL_STACKS: StackTrace = StackTrace::with_max_entries(MAX_KERNEL_STACKS, 0);

#[map]
static OUTCOMES: PerCpuArray<u64> = PerCpuArray::with_max_entries(WalkOutcome::COUNT as u32, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT as u32, 0);

#[inline(always)]
pub(crate) fn count(counter: Counter, n: u64) {
    if let Some(p) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot; no concurrent writer on this CPU.
        unsafe { *p += n };
    }
}

#[inline(always)]
fn count_outcome(outcome: u32) {
    if let Some(p) = OUTCOMES.get_ptr_mut(outcome) {
        // SAFETY: per-CPU slot.
        unsafe { *p += 1 };
    }
}

/// Per-CPU words the walk's binary searches keep their position and length in, and
/// that array indexes pass through on their way to a pointer offset (entry
/// [`INDEX_SLOT_PROFILE`]: `profile`; [`INDEX_SLOT_OFF_CPU`]: the off-CPU walker, which
/// `profile` can interrupt on its CPU).
///
/// The verifier marks a scalar added to a map-value pointer precise, and precision
/// follows the value back through registers and stack slots: from a row or mapping
/// index into the search's position, length and step, whose states then no longer
/// prune one another, so that every exit of a search carried the rest of the walk step
/// again. The 6.18.44 kernel of this machine kind's later image (build `fc-v1252`)
/// refused `profile` that way at the 1,000,000-instruction limit (`off_cpu_return`
/// 628,529), where the image before (`fc-v1098`) had verified it in 179,504. A value
/// loaded from map memory has no history the verifier follows: with the search's
/// state here, `profile` verifies in 117,654 instructions on that kernel (154,042
/// with the search alone moved and indexes masked on the stack, `bounded`).
#[map]
static INDEX_SLOTS: PerCpuArray<[u64; 3]> = PerCpuArray::with_max_entries(2, 0);
/// `profile`'s entry of [`INDEX_SLOTS`].
pub(crate) const INDEX_SLOT_PROFILE: u32 = 0;
/// The off-CPU walker's entry of [`INDEX_SLOTS`].
pub(crate) const INDEX_SLOT_OFF_CPU: u32 = 1;

struct BpfTables {
    process: *const ProcessEntry,
    /// This walk's entry of [`INDEX_SLOTS`]: an index, a search's position and length.
    slot: *mut [u64; 3],
}

impl BpfTables {
    /// `index` after a round trip through map memory (see [`INDEX_SLOTS`]): the same
    /// value, with no history for the verifier. Both the map key and the offset in the
    /// entry are computed from it.
    #[inline(always)]
    fn hide(&self, index: u32) -> u32 {
        // SAFETY: `slot` is this CPU's INDEX_SLOTS entry for this walk, valid during the
        // program run; nothing else on this CPU writes it meanwhile.
        unsafe {
            let p = (*self.slot).as_mut_ptr();
            core::ptr::write_volatile(p, u64::from(index));
            core::ptr::read_volatile(p) as u32
        }
    }
}

/// A search's position and length in this walk's [`INDEX_SLOTS`] entry.
struct MapCells {
    pos: *mut u64,
    len: *mut u64,
}

impl SearchCells for MapCells {
    #[inline(always)]
    fn load(&mut self) -> (u32, u32) {
        // SAFETY: words of this CPU's INDEX_SLOTS entry for this walk (see `hide`).
        unsafe {
            (
                core::ptr::read_volatile(self.pos) as u32,
                core::ptr::read_volatile(self.len) as u32,
            )
        }
    }
    #[inline(always)]
    fn store(&mut self, pos: u32, len: u32) {
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(self.pos, u64::from(pos));
            core::ptr::write_volatile(self.len, u64::from(len));
        }
    }
}

impl Tables for BpfTables {
    #[inline(always)]
    fn narrow<const STEPS: u32>(
        &mut self,
        start: u32,
        n: u32,
        x: u64,
        key: fn(&mut Self, u32) -> Option<u64>,
    ) -> u32 {
        // SAFETY: as in `hide`.
        let p = unsafe { (*self.slot).as_mut_ptr() };
        let mut cells = MapCells {
            // SAFETY: entries 1 and 2 of the three.
            pos: unsafe { p.add(1) },
            len: unsafe { p.add(2) },
        };
        cells.store(start, n);
        search_narrow_in::<STEPS>(&mut cells, x, |k| key(self, k))
    }
    #[inline(always)]
    fn return_address_mask(&mut self) -> u64 {
        // SAFETY: `process` points to a PROCESSES value for the whole program run.
        sframe_common::layout::addr_mask(unsafe { (*self.process).addr_bits })
    }
    #[inline(always)]
    fn mapping_count(&mut self) -> u32 {
        // SAFETY: `process` points to a PROCESSES value for the whole program run.
        unsafe { (*self.process).count }
    }
    #[inline(always)]
    fn mapping(&mut self, index: u32) -> Option<MappingEntry> {
        // SAFETY: as above; the index is masked into the array.
        let i = self.hide(index) as usize & (MAX_MAPPINGS - 1);
        Some(unsafe { (*self.process).mappings[i] })
    }
    #[inline(always)]
    fn object(&mut self, id: u32) -> Option<ObjectEntry> {
        OBJECTS.get(id).copied()
    }
    #[inline(always)]
    fn page_entry(&mut self, index: u32) -> Option<u32> {
        let index = self.hide(index);
        PAGES
            .get(index / PAGE_BLOCK as u32)
            .map(|b| b.0[index as usize & (PAGE_BLOCK - 1)])
    }
    #[inline(always)]
    fn row(&mut self, index: u32) -> Option<RowEntry> {
        let index = self.hide(index);
        ROWS.get(index / ROW_BLOCK as u32)
            .map(|b| b.0[index as usize & (ROW_BLOCK - 1)])
    }
    #[inline(always)]
    fn rule(&mut self, index: u16) -> Option<RuleEntry> {
        RULES.get(u32::from(index)).copied()
    }
}

/// What `bpf_loop` hands each iteration (must live on the BPF stack).
#[repr(C)]
struct LoopCtx {
    state: *mut WalkState,
    process: *const ProcessEntry,
    window: *mut StackWindow,
    slot: *mut [u64; 3],
}

#[inline(always)]
fn read_user(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the user address.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// Copies `len` bytes of user memory from `start` into the window.
#[inline(always)]
fn fill_window(window: &mut StackWindow, start: u64, len: u64) -> bool {
    // The bound, restated for the verifier.
    if len > WINDOW_BYTES as u64 {
        return false;
    }
    // SAFETY: `words` holds WINDOW_BYTES bytes; bpf_probe_read_user checks the source.
    unsafe {
        bpf_probe_read_user_raw(
            window.words.as_mut_ptr().cast(),
            len as u32,
            start as *const c_void,
        ) == 0
    }
}

/// `bpf_loop`'s native frame step. (The same body as `native_frame`'s after its
/// lookups, written out: the two sharing an inlined function made `profile` verify in
/// 446,157 instructions instead of 193,341 on 6.18.)
unsafe extern "C" fn walk_callback(_index: u32, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the LoopCtx on the caller's stack; its pointers are a per-CPU map
    // value and a PROCESSES value, valid during the loop.
    let ctx = unsafe { &*(ctx as *const LoopCtx) };
    let state = unsafe { &mut *ctx.state };
    let window = unsafe { &mut *ctx.window };
    let mut tables = BpfTables {
        process: ctx.process,
        slot: ctx.slot,
    };
    let mut read = |addr| window.read(addr, fill_window, read_user);
    if walk_step(state, &mut tables, &mut read) {
        0
    } else {
        1
    }
}

/// One frame of the native walk of process `tgid` into entry 0 of `scratch` (the
/// walker without `bpf_loop`: it finds its state and the process's tables again at
/// each frame); false when the walk is over.
#[inline(always)]
pub(crate) fn native_frame(
    scratch: &PerCpuArray<WalkState>,
    window: &PerCpuArray<StackWindow>,
    index_slot: u32,
    tgid: u32,
) -> bool {
    let (Some(state), Some(window), Some(slot)) = (
        scratch.get_ptr_mut(0),
        window.get_ptr_mut(0),
        INDEX_SLOTS.get_ptr_mut(index_slot),
    ) else {
        return false;
    };
    let Some(process) = PROCESSES.get_ptr(tgid) else {
        // Removed during the walk (the process exited and user space dropped it).
        // SAFETY: a per-CPU map value of the walking program.
        unsafe { (*state).outcome = WalkOutcome::UnknownProcess as u32 };
        return false;
    };
    // SAFETY: per-CPU map values of the walking program and a PROCESSES value, valid
    // during the program run; nothing else on this CPU uses them meanwhile.
    let (state, window) = unsafe { (&mut *state, &mut *window) };
    let mut tables = BpfTables { process, slot };
    let mut read = |addr| window.read(addr, fill_window, read_user);
    walk_step(state, &mut tables, &mut read)
}

/// `THREAD_NAMES`: whether the count key carries the thread's name (false only in the
/// benchmark's `profile_no_thread_names`).
#[inline(always)]
pub fn profile<const THREAD_NAMES: bool, W: Walker>(ctx: &PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_target(tgid) {
        count(Counter::Ignored, 1);
        return 0;
    }
    // SAFETY: `regs` is the first member of bpf_perf_event_data.
    let ctx_regs: *const pt_regs = unsafe { core::ptr::addr_of!((*ctx.ctx).regs) };
    let user = unsafe { regs::user_regs(ctx_regs) };
    if user.is_none() && crate::filter_flags() != 0 {
        // Kernel threads in whole-system or cgroup mode: no user stack to walk.
        count(Counter::Ignored, 1);
        return 0;
    }
    count(Counter::Samples, 1);
    let mut key = CountKey {
        pid: tgid,
        tid: pid_tgid as u32,
        user_stack: 0,
        kernel_stack: -1,
        outcome: WalkOutcome::NoUserRegs as u32,
        comm: [0; 16],
    };
    // The interrupted thread's name: threads of a pool told apart at no walk cost. Called
    // without branching on its result (a branch would make the verifier explore the whole
    // walk twice, once per state of these stack bytes); on failure they stay zero.
    if THREAD_NAMES {
        // SAFETY: the helper writes at most `comm.len()` bytes into `key.comm`.
        unsafe {
            aya_ebpf::helpers::generated::bpf_get_current_comm(
                key.comm.as_mut_ptr().cast(),
                key.comm.len() as u32,
            )
        };
    }
    if let Some((_, RegsSource::Task)) = user {
        count(Counter::SamplesInKernel, 1);
    }
    let in_kernel = !matches!(user, Some((_, RegsSource::Interrupt)));
    if in_kernel {
        match ctx.get_stackid(&KERNEL_STACKS, 0) {
            Ok(id) => key.kernel_stack = id as i32,
            Err(_) => count(Counter::KernelStackFailed, 1),
        }
    }
    if let Some((pt, _)) = user {
        key.outcome = walk_in::<W>(&SCRATCH, &WINDOW, INDEX_SLOT_PROFILE, tgid, pt);
        // The interpreter frames follow the native ones; a deferred sample carries them
        // in its record (its native frames are walked again in user space).
        let py = crate::python::append_frames::<W>(
            &SCRATCH,
            tgid,
            pid_tgid as u32,
            crate::python::PY_WALK_PROFILE,
        );
        if needs_tables(&SCRATCH, key.outcome) {
            // (The native outcome: user space walks it again and adds `py.unread`.)
            lifecycle::send_miss(tgid);
            if defer(&key, pt, 0, 0, 0, &py) {
                count(Counter::Deferred, 1);
                return 0;
            }
        }
        // Stored only now that it is counted: a deferred sample's partial stack would
        // stay in `STACKS` with no count naming it, and user space drains only the
        // stacks counts name (under process churn such stacks filled the map).
        key.user_stack = store_stack(&SCRATCH);
        key.outcome = WalkOutcome::with_python(key.outcome, py.unread);
    }
    count_outcome(key.outcome);
    bump(&key);
    0
}

/// Walks that stopped for lack of tables user space is about to load: no table for the
/// process, or a PC outside its known mappings not reached through a frame-pointer guess
/// (after one, an unknown PC is more likely garbage than a new mapping).
#[inline(always)]
pub(crate) fn needs_tables(scratch: &PerCpuArray<WalkState>, outcome: u32) -> bool {
    if outcome == WalkOutcome::UnknownProcess as u32 {
        return true;
    }
    if outcome != WalkOutcome::NoMapping as u32 {
        return false;
    }
    match scratch.get_ptr(0) {
        // SAFETY: per-CPU scratch of this program.
        Some(st) => unsafe { (*st).frames_from_fp == 0 },
        None => false,
    }
}

/// Samples waiting in user space for their tables.
#[map]
static DEFERRED: RingBuf = RingBuf::with_byte_size(DEFERRED_RING_BYTES, 0);

/// Sends the sample's registers and the top of its stack to user space (`DEFERRED`),
/// with the nanoseconds of an off-CPU sleep (0 for an on-CPU sample) and its state;
/// false when the ring buffer is full.
#[inline(always)]
pub(crate) fn defer(
    key: &CountKey,
    pt: &pt_regs,
    off_cpu_ns: u64,
    off_cpu_state: u32,
    off_cpu_kernel_stack: u64,
    py: &crate::python::PyWords,
) -> bool {
    let Some(mut entry) = DEFERRED.reserve::<DeferredSample>(0) else {
        count(Counter::DeferredLost, 1);
        return false;
    };
    let rec = entry.as_mut_ptr();
    let regs = regs::walk_regs(pt);
    let base = regs.sp & !(DEFERRED_PAGE as u64 - 1);
    // SAFETY: `rec` is the reserved record, written field by field before submit; the
    // stack pages are read with bpf_probe_read_user, which checks the user addresses.
    unsafe {
        (*rec).pid = key.pid;
        (*rec).tid = key.tid;
        (*rec).kernel_stack = key.kernel_stack;
        (*rec).stack_base = base;
        (*rec).off_cpu_ns = off_cpu_ns;
        (*rec).off_cpu_state = off_cpu_state;
        (*rec)._pad = 0;
        (*rec).off_cpu_kernel_stack = off_cpu_kernel_stack;
        // A window of MAX_PY_FRAMES words of the stack holding them (a fixed size the
        // verifier needs no bound for, inside the stack's array), and where they are in it.
        (*rec).py_len = 0;
        (*rec).py_skip = 0;
        let last_window = (MAX_FRAMES - MAX_PY_FRAMES as usize) as u32;
        let first = sframe_common::bounded(py.first as usize, MAX_FRAMES) as u32;
        let start = if first > last_window {
            last_window
        } else {
            first
        };
        if !py.frames.is_null()
            && py.len > 0
            && py.len <= MAX_PY_FRAMES
            && aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                (*rec).py.as_mut_ptr().cast(),
                MAX_PY_FRAMES * 8,
                py.frames.add(start as usize).cast(),
            ) == 0
        {
            (*rec).py_len = py.len;
            (*rec).py_skip = first - start;
        }
        (*rec).regs = regs;
        regs::dwarf_regs(pt, &mut (*rec).top);
        let mut len = 0u32;
        let mut page = 0;
        while page < DEFERRED_PAGES {
            let dst = (*rec).stack.as_mut_ptr().add(page * DEFERRED_PAGE);
            let src = (base + (page * DEFERRED_PAGE) as u64) as *const c_void;
            if bpf_probe_read_user_raw(dst.cast(), DEFERRED_PAGE as u32, src) != 0 {
                break;
            }
            len += DEFERRED_PAGE as u32;
            page += 1;
        }
        (*rec).stack_len = len;
    }
    entry.submit(0);
    true
}

/// Walks the user stack of process `tgid` into `scratch`, reading through `window`
/// (per-CPU: a program that can be interrupted by `profile` on its CPU, the off-CPU
/// walker, has its own), iterating as `W` does; returns the outcome.
#[inline(always)]
pub(crate) fn walk_in<W: Walker>(
    scratch: &PerCpuArray<WalkState>,
    window: &PerCpuArray<StackWindow>,
    index_slot: u32,
    tgid: u32,
    pt: &pt_regs,
) -> u32 {
    let (Some(state), Some(window), Some(slot)) = (
        scratch.get_ptr_mut(0),
        window.get_ptr_mut(0),
        INDEX_SLOTS.get_ptr_mut(index_slot),
    ) else {
        return WalkOutcome::NoScratch as u32;
    };
    // SAFETY: per-CPU, used by this program only; a new sample starts with no window.
    unsafe { (*window).clear() };
    // SAFETY: per-CPU scratch, used by this program only, never concurrently on one CPU.
    let st = unsafe { &mut *state };
    st.start(regs::walk_regs(pt));
    regs::dwarf_regs(pt, &mut st.top);
    match PROCESSES.get_ptr(tgid) {
        Some(_) if !W::BPF_LOOP => repeat::<NATIVE_CALLS>(|| W::native_frame(tgid)),
        Some(process) => {
            let mut loop_ctx = LoopCtx {
                state,
                process,
                window,
                slot,
            };
            // SAFETY: bpf_loop with a static callback and a pointer to the stack.
            unsafe {
                bpf_loop(
                    MAX_FRAMES as u32 + 1,
                    walk_callback as *mut c_void,
                    &mut loop_ctx as *mut LoopCtx as *mut c_void,
                    0,
                )
            };
        }
        None => {
            // Tables not loaded yet: keep the sampled PC at least.
            st.stack.frames[0] = st.regs.pc;
            st.stack.len = 1;
            st.hash = sframe_common::stack::mix(st.hash, st.regs.pc);
            st.outcome = WalkOutcome::UnknownProcess as u32;
        }
    }
    count(Counter::FramesFromTable, u64::from(st.frames_from_table));
    count(
        Counter::FramesFromFramePointer,
        u64::from(st.frames_from_fp) + u64::from(st.frames_guessed),
    );
    st.outcome
}

/// Stores the stack walked into `scratch` in `STACKS` (once per distinct stack) and
/// returns its key, or 0 when the map is full (the sample is counted without it).
#[inline(always)]
pub(crate) fn store_stack(scratch: &PerCpuArray<WalkState>) -> u64 {
    let Some(state) = scratch.get_ptr(0) else {
        return 0;
    };
    // SAFETY: per-CPU scratch of the program that just walked into it.
    let st = unsafe { &*state };
    let k = st.stack_key();
    // Most stacks are stored already: a lookup takes no bucket lock, an insert does.
    if STACKS.get_ptr(k).is_some() {
        return k;
    }
    // A reference to the scratch copy: passing the 2 KiB stack by value would put it on
    // the 512-byte BPF stack.
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value would copy the stack onto the BPF stack"
    )]
    let inserted = STACKS.insert(k, &st.stack, u64::from(BPF_NOEXIST));
    match inserted {
        // The same stack is stored already.
        Ok(()) => k,
        Err(e) if e == -EEXIST => k,
        Err(_) => {
            count(Counter::StackMapFull, 1);
            0
        }
    }
}

/// Adds one sample to the key's count. Keys include the thread id and a thread runs on
/// one CPU at a time, so two programs never update one key concurrently: a plain add
/// suffices (the BPF target has no atomic read-modify-write in `core`).
#[inline(always)]
fn bump(key: &CountKey) {
    if let Some(n) = COUNTS.get_ptr_mut(key) {
        // SAFETY: a COUNTS value, see above.
        unsafe { *n += 1 };
        return;
    }
    if COUNTS.insert(key, 1u64, u64::from(BPF_NOEXIST)).is_err() {
        count(Counter::CountMapFull, 1);
    }
}
