//! The kernel map layout of the unwind tables.
//!
//! ```text
//! PROCESSES  hash   tgid -> ProcessEntry { count, mappings[MAX_MAPPINGS] sorted by start }
//!                         MappingEntry { start, end, bias, object }   (object vaddr = pc - bias)
//! OBJECTS    array  object id -> ObjectEntry { base, page_first, page_count, row_first,
//!                                                page_shift }
//! PAGES      array  of PageBlock (PAGE_BLOCK u32s): per object page_count + 1 entries;
//!                   entry p = index (relative to row_first) of the first row of page p,
//!                   entry page_count = the object's row count (sentinel)
//! ROWS       array  of RowBlock (ROW_BLOCK rows of 4 bytes): RowEntry { addr_low, rule }
//! RULES      array  rule index -> RuleEntry (12 bytes), shared by all objects; 0 = no rule
//! ```
//!
//! A page covers `1 << ObjectEntry::page_shift` bytes of an object's address space
//! starting at `ObjectEntry::base` (256 bytes to 64 KiB, chosen per object: see
//! `budget::MAX_PAGE_SHIFT`). A row costs 4 bytes: the low `page_shift` (≤ 16) bits of
//! its address in its page and a 16-bit rule index. A page need not start with a row
//! (nor hold any): the last row before its rows, in an earlier page, runs on into it, so
//! the search inside a page starts from that row. Function boundaries are rows too:
//! where a function ends and the next does not start, a row with rule 0 ("no rule")
//! begins.
//!
//! Array maps round elements up to 8 bytes, so rows and page entries are stored in
//! blocks; `ROW_BLOCK` rows per element keeps the 4-byte cost.

use crate::budget::MAX_MAPPINGS;

/// No object table for this mapping (use frame pointers).
pub const NO_OBJECT: u32 = u32::MAX;

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingEntry {
    /// Start address of the mapping in the process (inclusive).
    pub start: u64,
    /// End address of the mapping in the process (exclusive).
    pub end: u64,
    /// `object virtual address = pc - bias`.
    pub bias: u64,
    /// Index in OBJECTS, or [`NO_OBJECT`].
    pub object: u32,
    /// `MAPPING_FLAG_*` bits.
    pub flags: u32,
}

/// The mapping is the vDSO.
pub const MAPPING_FLAG_VDSO: u32 = 1 << 0;
/// The mapping's object (`NO_OBJECT` until then) is being built by user space: its table
/// is coming. Where the frame-pointer fallback fails on it, the walk stops as in an
/// unknown mapping (`no_mapping`, with no frame-pointer frame before it: the kernel
/// defers the sample) rather than count a broken stack.
pub const MAPPING_FLAG_BUILDING: u32 = 1 << 1;

/// A process's executable mappings, sorted by `start`, non-overlapping.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessEntry {
    /// Number of valid entries at the start of `mappings`.
    pub count: u32,
    /// The process's user virtual-address bits ([`addr_bits`]): every return address
    /// the walk recovers is cut to them, which strips AArch64's pointer-authentication
    /// codes whichever key signed them. 0: no cut (x86-64).
    pub addr_bits: u32,
    /// The mappings, sorted by `start`; the first `count` are valid.
    pub mappings: [MappingEntry; MAX_MAPPINGS],
}

/// `ProcessEntry::addr_bits` for a process whose highest executable mapping ends at
/// `max_end`, on AArch64 (`aarch64`) or not. On AArch64 a return address signed with
/// pointer authentication carries its code above the virtual-address bits: those are
/// 48 (every Linux configuration's default) unless the process has code above 2^48
/// (a 52-bit kernel, and only for a process that asked for such addresses); the bits
/// of a real return address never go past its executable mappings. Elsewhere 0.
pub fn addr_bits(aarch64: bool, max_end: u64) -> u32 {
    match (aarch64, max_end > 1 << 48) {
        (false, _) => 0,
        (true, false) => 48,
        (true, true) => 52,
    }
}

/// The mask [`ProcessEntry::addr_bits`] stands for.
#[inline(always)]
pub fn addr_mask(bits: u32) -> u64 {
    if bits == 0 || bits >= 64 {
        u64::MAX
    } else {
        (1u64 << (bits & 63)) - 1
    }
}

impl Default for ProcessEntry {
    fn default() -> Self {
        Self {
            count: 0,
            addr_bits: 0,
            mappings: [MappingEntry::default(); MAX_MAPPINGS],
        }
    }
}

/// One object's tables.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectEntry {
    /// Object virtual address of the start of page 0 (aligned to the page size).
    pub base: u64,
    /// Index of the object's first entry in PAGES (not in blocks).
    pub page_first: u32,
    /// Number of pages (PAGES holds `page_count + 1` entries for the object).
    pub page_count: u32,
    /// Index of the object's first row in ROWS (not in blocks).
    pub row_first: u32,
    /// Log2 of the object's page size in bytes (`budget::MIN_PAGE_SHIFT` to
    /// `budget::MAX_PAGE_SHIFT`).
    pub page_shift: u32,
}

/// One row: from its address to the next row's, `rule` holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RowEntry {
    /// Low `page_shift` bits of the row's start address (relative to its page).
    pub addr_low: u16,
    /// Index in RULES; 0 means "no rule here".
    pub rule: u16,
}

/// Rows per ROWS element ([`RowBlock`]).
pub const ROW_BLOCK: usize = 8;
/// PAGES entries per element ([`PageBlock`]).
pub const PAGE_BLOCK: usize = 8;

/// ROWS element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowBlock(pub [RowEntry; ROW_BLOCK]);

/// PAGES element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageBlock(pub [u32; PAGE_BLOCK]);

/// How to find the CFA: `RuleEntry::cfa_base`.
pub const CFA_BASE_SP: u8 = 0;
/// The CFA is computed from the frame pointer.
pub const CFA_BASE_FP: u8 = 1;
/// `0x80 | dwarf_register` (register < 32, [`crate::step::TOP_REGS`]; the step masks it with `& 0x1f`): top frame only.
pub const CFA_BASE_REG: u8 = 0x80;
/// No rule: the rule entry at index 0.
pub const CFA_BASE_NONE: u8 = 0xff;

/// How to recover a register (RA or FP): `RuleEntry::ra_kind` / `fp_kind`.
/// The value is unchanged (FP), or still in the link register (AArch64 RA, top frame).
pub const REG_UNCHANGED: u8 = 0;
/// Saved at `CFA + offset`.
pub const REG_AT_CFA: u8 = 1;
/// Saved at `SP + offset` (SP of the frame being unwound).
pub const REG_AT_SP: u8 = 2;
/// Saved at `FP + offset`.
pub const REG_AT_FP: u8 = 3;
/// Undefined: for the RA, the outermost frame.
pub const REG_UNDEFINED: u8 = 4;
/// The value is `CFA + offset`.
pub const REG_VAL_CFA: u8 = 5;
/// Held in DWARF register `offset` (top frame only).
pub const REG_IN_REG: u8 = 6;

/// `RuleEntry::flags`: the CFA is `*(base + offset)`.
pub const RULE_FLAG_CFA_DEREF: u8 = 1 << 0;
/// The frame is a signal trampoline: the caller's PC is exact, not a return address.
pub const RULE_FLAG_SIGNAL: u8 = 1 << 1;
/// The RA is signed (AArch64 pointer authentication).
pub const RULE_FLAG_MANGLED_RA: u8 = 1 << 2;
/// An AMD64 PLT block of 16-byte, 16-aligned entries (`jmp *GOT; push N; jmp PLT0`):
/// from byte `fp_offset` of each entry on (the lazy-binding `push`), the CFA is 8
/// bytes further; the FP is unchanged. One row covers the whole block instead of two
/// per entry. [`RuleEntry::at`] resolves it for a PC.
pub const RULE_FLAG_PLT16: u8 = 1 << 3;

/// One deduplicated rule.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleEntry {
    /// Bytes added to the CFA base register's value (for a [`RULE_FLAG_PLT16`] rule, see
    /// [`RuleEntry::cfa_offset_at`]).
    pub cfa_offset: i32,
    /// Offset for `ra_kind`: bytes from the CFA, SP or FP, or the DWARF register number
    /// for [`REG_IN_REG`].
    pub ra_offset: i16,
    /// Offset for `fp_kind`, as `ra_offset`; for a [`RULE_FLAG_PLT16`] rule, the byte of
    /// each PLT entry from which the CFA is 8 further.
    pub fp_offset: i16,
    /// How to find the CFA: a `CFA_BASE_*` value.
    pub cfa_base: u8,
    /// How to recover the caller's return address: a `REG_*` value.
    pub ra_kind: u8,
    /// How to recover the caller's frame pointer: a `REG_*` value.
    pub fp_kind: u8,
    /// `RULE_FLAG_*` bits.
    pub flags: u8,
}

impl RuleEntry {
    /// The "no rule here" entry (index 0 of RULES).
    pub const NONE: RuleEntry = RuleEntry {
        cfa_offset: 0,
        ra_offset: 0,
        fp_offset: 0,
        cfa_base: CFA_BASE_NONE,
        ra_kind: REG_UNDEFINED,
        fp_kind: REG_UNCHANGED,
        flags: 0,
    };

    /// Whether this is the "no rule" entry (`cfa_base == CFA_BASE_NONE`, as in
    /// [`RuleEntry::NONE`]).
    pub const fn is_none(&self) -> bool {
        self.cfa_base == CFA_BASE_NONE
    }

    /// The CFA offset that holds at `pc`: for a [`RULE_FLAG_PLT16`] rule, 8 more from
    /// byte `fp_offset` of the PLT entry `pc` is in; otherwise `cfa_offset`. (What the
    /// walker uses, without copying the rule.)
    #[inline(always)]
    pub fn cfa_offset_at(&self, pc: u64) -> i32 {
        let past_push =
            self.flags & RULE_FLAG_PLT16 != 0 && (pc & 15) as i64 >= i64::from(self.fp_offset);
        self.cfa_offset.wrapping_add(8 * i32::from(past_push))
    }

    /// The rule that holds at `pc`, as a plain rule ([`RuleEntry::cfa_offset_at`]):
    /// for comparing a PLT rule with the rows it stands for.
    pub fn at(&self, pc: u64) -> RuleEntry {
        let mut r = *self;
        if r.flags & RULE_FLAG_PLT16 != 0 {
            r.cfa_offset = self.cfa_offset_at(pc);
            r.flags &= !RULE_FLAG_PLT16;
            r.fp_offset = 0;
        }
        r
    }
}

const _: () = assert!(core::mem::size_of::<MappingEntry>() == 32);
const _: () = assert!(core::mem::size_of::<ObjectEntry>() == 24);
const _: () = assert!(core::mem::size_of::<RowEntry>() == 4);
const _: () = assert!(core::mem::size_of::<RowBlock>() == 4 * ROW_BLOCK);
const _: () = assert!(core::mem::size_of::<PageBlock>() == 4 * PAGE_BLOCK);
const _: () = assert!(core::mem::size_of::<RuleEntry>() == 12);
const _: () = assert!(ROW_BLOCK.is_power_of_two() && PAGE_BLOCK.is_power_of_two());
const _: () = assert!(core::mem::size_of::<ProcessEntry>() == 8 + 32 * MAX_MAPPINGS);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all repr(C) with integer fields only and no implicit padding (sizes
    // asserted above).
    unsafe impl aya::Pod for MappingEntry {}
    unsafe impl aya::Pod for ProcessEntry {}
    unsafe impl aya::Pod for ObjectEntry {}
    unsafe impl aya::Pod for RowEntry {}
    unsafe impl aya::Pod for RowBlock {}
    unsafe impl aya::Pod for PageBlock {}
    unsafe impl aya::Pod for RuleEntry {}
}
