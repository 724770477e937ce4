//! The frame step and the table lookup: pure functions over injected map accessors and
//! an injected memory reader. The eBPF program runs them once per frame (inside
//! `bpf_loop`); host tests and fuzzing run the same code through [`walk`].
//!
//! Termination and safety do not depend on the tables or the stack being sane: every
//! search has a fixed step count, every walk at most `MAX_FRAMES` steps, and a caller
//! frame must have a CFA above the current stack pointer (except after a signal frame).

use crate::{
    budget::{MAPPING_SEARCH_STEPS, MAX_FRAMES, MAX_MAPPINGS, ROW_SEARCH_STEPS},
    layout::*,
    outcome::WalkOutcome,
    stack::{FRAME_EXACT, HASH_SEED, UserStack, finish, lookup_address, mix},
};

/// DWARF registers kept for the top frame (x86-64 uses 0..=16, AArch64 0..=31).
pub const TOP_REGS: usize = 32;

/// The registers the walk carries from frame to frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// Program counter.
    pub pc: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (rbp on x86-64, x29 on AArch64).
    pub fp: u64,
}

/// Read access to the kernel tables (BPF maps, or slices in host tests).
pub trait Tables {
    /// Executable mappings of the sampled process (sorted by start).
    fn mapping_count(&mut self) -> u32;
    /// The mapping at `index` (in start order), or `None` if it cannot be read.
    fn mapping(&mut self, index: u32) -> Option<MappingEntry>;
    /// OBJECTS entry `id`, or `None` if it cannot be read.
    fn object(&mut self, id: u32) -> Option<ObjectEntry>;
    /// PAGES entry by absolute index.
    fn page_entry(&mut self, index: u32) -> Option<u32>;
    /// ROWS entry by absolute index.
    fn row(&mut self, index: u32) -> Option<RowEntry>;
    /// RULES entry `index` (0 is [`RuleEntry::NONE`]), or `None` if it cannot be read.
    fn rule(&mut self, index: u16) -> Option<RuleEntry>;
    /// The process's [`crate::layout::addr_mask`]: every recovered return address is cut
    /// to it (AArch64 pointer authentication).
    fn return_address_mask(&mut self) -> u64;
    /// [`search_narrow`] with `key` reading these tables. The kernel side keeps the
    /// search's position and length in map memory instead of registers.
    #[inline(always)]
    fn narrow<const STEPS: u32>(
        &mut self,
        start: u32,
        n: u32,
        x: u64,
        key: fn(&mut Self, u32) -> Option<u64>,
    ) -> u32
    where
        Self: Sized,
    {
        search_narrow::<STEPS>(start, n, x, |k| key(self, k))
    }
}

/// Where a binary search keeps its position and length between halvings.
pub trait SearchCells {
    /// The position and the length.
    fn load(&mut self) -> (u32, u32);
    /// Keeps a new position and length.
    fn store(&mut self, pos: u32, len: u32);
}

/// Position and length in locals (host side, and [`Tables::narrow`]'s default). The
/// kernel side keeps them in map memory instead, where the verifier does not follow
/// their history (`sframe-ebpf`'s `INDEX_SLOTS`).
pub struct LocalCells(pub u32, pub u32);

impl SearchCells for LocalCells {
    #[inline(always)]
    fn load(&mut self) -> (u32, u32) {
        (self.0, self.1)
    }
    #[inline(always)]
    fn store(&mut self, pos: u32, len: u32) {
        self.0 = pos;
        self.1 = len;
    }
}

/// The last element of `[start, start + n)` whose key is ≤ `x` if there is one (`n` ≥
/// 1), in at most `STEPS` halvings (enough for `n < 2^STEPS`): the candidate, whose own
/// key is not checked (callers read the element anyway and check it themselves). The
/// choice is arithmetic, not a branch on data; a key that cannot be read counts as
/// greater than `x`.
#[inline(always)]
pub fn search_narrow<const STEPS: u32>(
    start: u32,
    n: u32,
    x: u64,
    key: impl FnMut(u32) -> Option<u64>,
) -> u32 {
    search_narrow_in::<STEPS>(&mut LocalCells(start, n), x, key)
}

/// [`search_narrow`] from the position and length in `cells`.
#[inline(always)]
pub fn search_narrow_in<const STEPS: u32>(
    cells: &mut impl SearchCells,
    x: u64,
    mut key: impl FnMut(u32) -> Option<u64>,
) -> u32 {
    let mut i = 0;
    while i < STEPS {
        let (pos, len) = cells.load();
        // Leaving early is the only data-dependent branch. Its exits meet after the
        // loop in states the verifier finds equal only when the position and length
        // carry no history it follows: the kernel side keeps them in map memory.
        if len <= 1 {
            break;
        }
        let half = len / 2;
        // A comparison, compiled to a branch: the same searches recur from sample to
        // sample, and a predicted branch lets the next key's load start before this one
        // is compared. The arithmetic form (no branch: the borrow of `x - key`) made the
        // walk 1.45x slower per frame at 256 frames (BENCHMARKS.md, section 1).
        let le = matches!(key(pos.wrapping_add(half)), Some(k) if k <= x) as u32;
        cells.store(pos.wrapping_add(half * le), len - half);
        i += 1;
    }
    cells.load().0
}

/// What the tables say about a PC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A row with a rule.
    Rule(RuleEntry),
    /// In an object with tables, but no rule covers the PC.
    NoRule,
    /// In an executable mapping without tables.
    NoTable,
    /// In an executable mapping whose table is being built
    /// ([`MAPPING_FLAG_BUILDING`]).
    Building,
    /// In no known executable mapping.
    NoMapping,
}

/// What the previous lookups of a walk found: consecutive frames are mostly in the same
/// mapping, object and page. Only a shortcut: any contents give the same results as
/// [`LookupCache::EMPTY`] as long as the tables do not change during the walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupCache {
    /// Index of a mapping to try first (any value is safe).
    pub mapping_hint: u32,
    /// Id of the object in `object`, or [`NO_OBJECT`]: none cached.
    pub object_id: u32,
    /// The OBJECTS entry of `object_id`.
    pub object: ObjectEntry,
    /// Absolute PAGES index whose entry and the next are `page_lo`, `page_hi`, valid when
    /// `page_valid` is non-zero.
    pub page_index: u32,
    /// Non-zero when `page_index`, `page_lo` and `page_hi` are valid.
    pub page_valid: u32,
    /// PAGES entry `page_index`: the page's first row, relative to the object's
    /// `row_first`.
    pub page_lo: u32,
    /// PAGES entry `page_index + 1`: the end (exclusive) of the page's rows, relative to
    /// the object's `row_first`.
    pub page_hi: u32,
}

impl LookupCache {
    /// Nothing cached.
    pub const EMPTY: LookupCache = LookupCache {
        mapping_hint: 0,
        object_id: NO_OBJECT,
        object: ObjectEntry {
            base: 0,
            page_first: 0,
            page_count: 0,
            row_first: 0,
            page_shift: 0,
        },
        page_index: 0,
        page_valid: 0,
        page_lo: 0,
        page_hi: 0,
    };
}

/// Finds the rule for `pc` of the sampled process, through and into `cache`.
#[inline(always)]
pub fn find_rule<T: Tables>(t: &mut T, pc: u64, cache: &mut LookupCache) -> Lookup {
    let count = t.mapping_count();
    let n = if count as usize > MAX_MAPPINGS {
        MAX_MAPPINGS as u32
    } else {
        count
    };
    // Consecutive frames are mostly in the same object: try the previous mapping first.
    let hint = cache.mapping_hint;
    let cached = t
        .mapping(hint)
        .filter(|m| hint < n && m.start <= pc && pc < m.end);
    let m = match cached {
        Some(m) => m,
        None => {
            if n == 0 {
                return Lookup::NoMapping;
            }
            let i =
                t.narrow::<MAPPING_SEARCH_STEPS>(0, n, pc, |t, i| t.mapping(i).map(|m| m.start));
            let Some(m) = t.mapping(i) else {
                return Lookup::NoMapping;
            };
            if pc < m.start || pc >= m.end {
                return Lookup::NoMapping;
            }
            cache.mapping_hint = i;
            m
        }
    };
    if m.object == NO_OBJECT {
        return if m.flags & MAPPING_FLAG_BUILDING != 0 {
            Lookup::Building
        } else {
            Lookup::NoTable
        };
    }
    let o = if cache.object_id == m.object {
        cache.object
    } else {
        let Some(o) = t.object(m.object) else {
            return Lookup::NoTable;
        };
        cache.object_id = m.object;
        cache.object = o;
        o
    };
    let vaddr = pc.wrapping_sub(m.bias);
    let Some(rel) = vaddr.checked_sub(o.base) else {
        return Lookup::NoRule;
    };
    // Any shift is safe (the page is checked against the count, the row search is
    // bounded); user space writes 8 to 16.
    let shift = o.page_shift & 63;
    let page = rel >> shift;
    if page >= u64::from(o.page_count) {
        return Lookup::NoRule;
    }
    let index = o.page_first.wrapping_add(page as u32);
    let (lo, hi) = if cache.page_valid != 0 && cache.page_index == index {
        (cache.page_lo, cache.page_hi)
    } else {
        let (Some(lo), Some(hi)) = (t.page_entry(index), t.page_entry(index.wrapping_add(1)))
        else {
            return Lookup::NoRule;
        };
        cache.page_index = index;
        cache.page_valid = 1;
        cache.page_lo = lo;
        cache.page_hi = hi;
        (lo, hi)
    };
    if hi < lo {
        return Lookup::NoRule;
    }
    let first = o.row_first.wrapping_add(lo);
    let low = rel & ((1u64 << shift) - 1);
    // The page's last row at or below `low`. A page need not start with a row: where it
    // has none there, the last row before its rows (the last of an earlier page of the
    // object) runs on into it. The search starts from that row, whose own key it never
    // reads (it only probes above its start): a candidate above the start is at or below
    // `low`, the start itself is the row before when there is one, else it is checked.
    let before = if lo > 0 { 1 } else { 0 };
    let n = hi - lo + before;
    if n == 0 {
        return Lookup::NoRule;
    }
    let k = t.narrow::<ROW_SEARCH_STEPS>(first.wrapping_sub(before), n, low, |t, k| {
        t.row(k).map(|r| u64::from(r.addr_low))
    });
    let Some(row) = t.row(k) else {
        return Lookup::NoRule;
    };
    if k == first && u64::from(row.addr_low) > low {
        return Lookup::NoRule;
    }
    match t.rule(row.rule) {
        Some(rule) if !rule.is_none() => Lookup::Rule(rule),
        _ => Lookup::NoRule,
    }
}

/// The result of one frame step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The caller's registers; `exact_pc` when the caller's PC is not a return address
    /// (the frame was a signal trampoline).
    Caller {
        /// The caller's registers (its SP is this frame's CFA).
        regs: Regs,
        /// The caller's PC is exact, not a return address.
        exact_pc: bool,
    },
    /// This frame is the outermost one.
    Outermost,
}

#[inline(always)]
fn add_signed(a: u64, off: i64) -> Option<u64> {
    a.checked_add_signed(off)
}

/// Recovers a register (RA or FP) of the caller by `kind` and `off`; `current` is its
/// value in the frame being unwound.
#[inline(always)]
fn recover(
    kind: u8,
    off: i16,
    current: u64,
    cfa: u64,
    regs: &Regs,
    top: Option<&[u64; TOP_REGS]>,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> Result<u64, WalkOutcome> {
    let off = i64::from(off);
    let mut at = |base: u64| {
        add_signed(base, off)
            .and_then(&mut *read)
            .ok_or(WalkOutcome::ReadFault)
    };
    match kind {
        REG_UNCHANGED => Ok(current),
        REG_AT_CFA => at(cfa),
        REG_AT_SP => at(regs.sp),
        REG_AT_FP => at(regs.fp),
        REG_VAL_CFA => add_signed(cfa, off).ok_or(WalkOutcome::NoProgress),
        REG_IN_REG => match top {
            Some(top) => Ok(top[crate::bounded(off as usize, TOP_REGS)]),
            None => Err(WalkOutcome::TopFrameOnlyRule),
        },
        _ => Err(WalkOutcome::NoRule),
    }
}

/// Applies `rule` to `regs`. `top` holds the DWARF registers of the interrupted frame,
/// only for the top frame. (A PLT rule is resolved at `regs.pc`: PLT code only jumps,
/// so its frame is never a caller's, whose PC would be a return address.)
#[inline(always)]
pub fn step_rule(
    rule: &RuleEntry,
    regs: &Regs,
    top: Option<&[u64; TOP_REGS]>,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> Result<Step, WalkOutcome> {
    let base = match rule.cfa_base {
        CFA_BASE_SP => regs.sp,
        CFA_BASE_FP => regs.fp,
        CFA_BASE_NONE => return Err(WalkOutcome::NoRule),
        b => match top {
            Some(top) => top[usize::from(b & 0x1f)],
            None => return Err(WalkOutcome::TopFrameOnlyRule),
        },
    };
    let mut cfa =
        add_signed(base, i64::from(rule.cfa_offset_at(regs.pc))).ok_or(WalkOutcome::NoProgress)?;
    if rule.flags & RULE_FLAG_CFA_DEREF != 0 {
        cfa = read(cfa).ok_or(WalkOutcome::ReadFault)?;
    }
    // The outermost frame ends the walk whatever its CFA (AArch64's `_start` pushes
    // nothing: its CFA is the SP).
    if rule.ra_kind == REG_UNDEFINED {
        return Ok(Step::Outermost);
    }
    let signal = rule.flags & RULE_FLAG_SIGNAL != 0;
    // A frameless leaf (AArch64: nothing pushed, the RA still in the link register) has
    // its CFA at the SP. The walk still advances: the caller's PC comes from the link
    // register, which only the top frame may use, so this happens once per walk.
    let leaf_in_lr = rule.ra_kind == REG_UNCHANGED && top.is_some() && cfa == regs.sp;
    if !signal && ((cfa <= regs.sp && !leaf_in_lr) || cfa & 7 != 0) {
        return Err(WalkOutcome::NoProgress);
    }
    // An unchanged RA is still in the link register (AArch64, DWARF 30): top frame only.
    let lr = match top {
        Some(top) => top[usize::from(crate::dwarf::AARCH64.ra)],
        None if rule.ra_kind == REG_UNCHANGED => return Err(WalkOutcome::TopFrameOnlyRule),
        None => 0,
    };
    // A signed RA (`RULE_FLAG_MANGLED_RA`) keeps its authentication code here: the walk
    // cuts every return address to the process's address bits (`walk_step`), frame-
    // pointer steps' too (their frame records hold signed RAs as well).
    let ra = recover(rule.ra_kind, rule.ra_offset, lr, cfa, regs, top, read)?;
    let fp = recover(rule.fp_kind, rule.fp_offset, regs.fp, cfa, regs, top, read)?;
    Ok(Step::Caller {
        regs: Regs {
            pc: ra,
            sp: cfa,
            fp,
        },
        exact_pc: signal,
    })
}

/// The frame-pointer step for code without tables: `[fp] = caller fp`,
/// `[fp + 8] = return address`, caller sp = fp + 16 (x86-64 and AArch64 frame records).
#[inline(always)]
pub fn step_frame_pointer(
    regs: &Regs,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> Result<Step, WalkOutcome> {
    if regs.fp == 0 {
        return Err(WalkOutcome::FramePointerEnd);
    }
    if regs.fp < regs.sp || regs.fp & 7 != 0 {
        return Err(WalkOutcome::NoProgress);
    }
    let ra = read(regs.fp.wrapping_add(8)).ok_or(WalkOutcome::ReadFault)?;
    let fp = read(regs.fp).ok_or(WalkOutcome::ReadFault)?;
    let sp = regs.fp.checked_add(16).ok_or(WalkOutcome::NoProgress)?;
    Ok(Step::Caller {
        regs: Regs { pc: ra, sp, fp },
        exact_pc: false,
    })
}

/// The walk's state, kept in per-CPU scratch by the eBPF program.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WalkState {
    /// The registers of the frame being unwound.
    pub regs: Regs,
    /// DWARF registers of the interrupted frame.
    pub top: [u64; TOP_REGS],
    /// Hash of the frame words recorded so far ([`mix`] from [`HASH_SEED`]);
    /// [`WalkState::stack_key`] completes it.
    pub hash: u64,
    /// A `WalkOutcome`, valid once the walk stopped.
    pub outcome: u32,
    /// Non-zero when `regs.pc` is exact (after a signal frame), not a return address.
    pub exact_pc: u32,
    /// Frames unwound with a table rule.
    pub frames_from_table: u32,
    /// Frames unwound (or attempted) with the frame-pointer step.
    pub frames_from_fp: u32,
    /// Frames unwound with the frame-pointer step in a mapping whose table is being
    /// built: guesses (a frameless function's `rbp` may be any pointer its code keeps
    /// there), counted apart so that a guessed return address in no known mapping leaves
    /// the sample to wait for the table instead of ending it as garbage.
    pub frames_guessed: u32,
    /// Keeps `cache` 8-byte aligned with no implicit padding.
    pub _pad: u32,
    /// What the previous frame's lookup found (a search shortcut).
    pub cache: LookupCache,
    /// The frame words recorded so far.
    pub stack: UserStack,
}

impl WalkState {
    /// Starts a walk at the interrupted frame.
    #[inline(always)]
    pub fn start(&mut self, regs: Regs) {
        self.regs = regs;
        self.hash = HASH_SEED;
        self.outcome = WalkOutcome::Truncated as u32;
        self.exact_pc = 0;
        self.frames_from_table = 0;
        self.frames_from_fp = 0;
        self.frames_guessed = 0;
        self.cache = LookupCache::EMPTY;
        self.stack.len = 0;
    }

    /// The stack's key for the STACKS map (never 0).
    #[inline(always)]
    pub fn stack_key(&self) -> u64 {
        finish(self.hash, self.stack.len)
    }
}

impl Default for WalkState {
    fn default() -> Self {
        Self {
            regs: Regs::default(),
            top: [0; TOP_REGS],
            hash: HASH_SEED,
            outcome: WalkOutcome::Truncated as u32,
            exact_pc: 0,
            frames_from_table: 0,
            frames_from_fp: 0,
            frames_guessed: 0,
            _pad: 0,
            cache: LookupCache::EMPTY,
            stack: UserStack::default(),
        }
    }
}

/// Records the current frame and unwinds it. Returns `false` when the walk ended
/// (`st.outcome` says how), `true` to go on.
#[inline(always)]
pub fn walk_step<T: Tables>(
    st: &mut WalkState,
    t: &mut T,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> bool {
    let i = st.stack.len;
    if i as usize >= MAX_FRAMES {
        st.outcome = WalkOutcome::Truncated as u32;
        return false;
    }
    let pc = st.regs.pc;
    let top = i == 0;
    // Caller frames with an exact PC (after a signal frame) are marked, for the
    // symbolizer; PCs are user addresses, below FRAME_EXACT.
    let word = if !top && st.exact_pc != 0 {
        pc | FRAME_EXACT
    } else {
        pc
    };
    st.stack.frames[crate::bounded(i as usize, MAX_FRAMES)] = word;
    st.stack.len = i + 1;
    st.hash = mix(st.hash, word);
    let lookup_pc = lookup_address(i as usize, word);
    let top_regs = if top { Some(&st.top) } else { None };
    let result = match find_rule(t, lookup_pc, &mut st.cache) {
        Lookup::Rule(rule) => {
            st.frames_from_table += 1;
            step_rule(&rule, &st.regs, top_regs, read)
        }
        Lookup::NoRule => {
            st.frames_from_fp += 1;
            step_frame_pointer(&st.regs, read).map_err(|e| match e {
                WalkOutcome::FramePointerEnd => WalkOutcome::NoRule,
                e => e,
            })
        }
        Lookup::NoTable => {
            st.frames_from_fp += 1;
            step_frame_pointer(&st.regs, read)
        }
        // Code built with frame pointers walks on meanwhile, to the end of its chain;
        // where the first frame-pointer step fails (code without them; a zero FP there
        // is far more often a register the code uses than the outermost frame), the
        // walk stops as if the mapping were unknown, for the sample to wait for the
        // table. A step that succeeds is a guess (`frames_guessed`): where code without
        // frame pointers keeps a readable pointer in `rbp`, it gives a garbage return
        // address, whose lookup then finds no mapping and leaves the sample to wait too
        // (it ended incomplete, through `[unknown]`, in a command's first milliseconds
        // while its libc's table was built).
        Lookup::Building => match step_frame_pointer(&st.regs, read) {
            Ok(step) => {
                st.frames_guessed += 1;
                Ok(step)
            }
            Err(WalkOutcome::FramePointerEnd) if st.frames_from_fp + st.frames_guessed > 0 => {
                st.frames_guessed += 1;
                Err(WalkOutcome::FramePointerEnd)
            }
            Err(_) => Err(WalkOutcome::NoMapping),
        },
        Lookup::NoMapping => Err(WalkOutcome::NoMapping),
    };
    match result {
        Ok(Step::Caller { mut regs, exact_pc }) => {
            regs.pc &= t.return_address_mask();
            if regs.pc == 0 {
                st.outcome = WalkOutcome::ZeroReturnAddress as u32;
                return false;
            }
            // Not a user address (a corrupted or hostile stack word): no mapping holds
            // it, and it must not pass for a FRAME_EXACT mark.
            if regs.pc & FRAME_EXACT != 0 {
                st.outcome = WalkOutcome::NoMapping as u32;
                return false;
            }
            st.regs = regs;
            st.exact_pc = exact_pc as u32;
            true
        }
        Ok(Step::Outermost) => {
            st.outcome = WalkOutcome::Complete as u32;
            false
        }
        Err(outcome) => {
            st.outcome = outcome as u32;
            false
        }
    }
}

/// The reference walker: the same steps as the eBPF program, for host tests and fuzzing.
pub fn walk<T: Tables>(
    st: &mut WalkState,
    regs: Regs,
    t: &mut T,
    read: &mut impl FnMut(u64) -> Option<u64>,
) -> WalkOutcome {
    st.start(regs);
    let mut n = 0;
    while n < MAX_FRAMES + 1 && walk_step(st, t, read) {
        n += 1;
    }
    WalkOutcome::try_from(st.outcome).unwrap_or(WalkOutcome::Truncated)
}

#[cfg(feature = "user")]
// SAFETY: repr(C), integers only, no implicit padding.
unsafe impl aya::Pod for WalkState {}

const _: () = assert!(core::mem::size_of::<WalkState>() <= crate::budget::MAX_SCRATCH_BYTES);
const _: () = assert!(TOP_REGS.is_power_of_two());
const _: () = assert!(core::mem::size_of::<LookupCache>() == 48);
// No implicit padding (aya::Pod).
const _: () = assert!(
    core::mem::size_of::<WalkState>()
        == 24 + 8 * TOP_REGS + 8 + 24 + 48 + core::mem::size_of::<UserStack>()
);

#[cfg(test)]
#[path = "step_tests.rs"]
mod tests;
