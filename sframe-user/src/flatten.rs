//! Flattening an object's [`UnwindTable`] into the kernel layout of
//! `sframe_common::layout`: 4-byte rows grouped in pages of 256 bytes to 64 KiB (the
//! finest that keep [`MIN_ROWS_PER_PAGE`] rows per page on average), rules deduplicated
//! into a dictionary shared by all objects.
//!
//! Function boundaries become rows: where a function ends and the next does not start,
//! a "no rule" row begins, unless only alignment padding lies between them
//! ([`crate::table::Function::padding_after`]): then the function's last row runs on
//! to the next function (a PC there is never executed) and often merges with its first.
//! AMD64 PLT blocks of 16-byte entries become one row with [`RULE_FLAG_PLT16`]; other
//! PCMASK functions are expanded into plain rows.

use std::collections::HashMap;

use sframe_common::{
    CfaBase, RegRule, RuleFlags, UnwindRule,
    budget::{MAX_PAGE_SHIFT, MAX_RULES, MIN_PAGE_SHIFT, MIN_ROWS_PER_PAGE},
    layout::*,
    step::Tables,
};

use crate::table::{Arch, CompactRow, PcType, UnwindTable};

/// Rows a PCMASK function may expand to before it is left without rules.
const MAX_PCMASK_EXPANSION: u64 = 1 << 16;
/// Pages one object may span (4 GiB of address space in pages of 64 KiB).
const MAX_PAGES_PER_OBJECT: u64 = 1 << 16;

/// Why a table could not be flattened.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum FlattenError {
    /// The shared rule dictionary holds [`MAX_RULES`] rules already.
    #[error("the rule dictionary is full ({MAX_RULES} rules)")]
    RuleDictionaryFull,
    /// The object's rows span more 64 KiB pages than one object may (65,536: 4 GiB).
    #[error("object spans {pages} pages of 64 KiB (limit {MAX_PAGES_PER_OBJECT})")]
    TooManyPages {
        /// Pages the rows span.
        pages: u64,
    },
    /// The object has more rows than a 32-bit index counts.
    #[error("object has {rows} rows (limit u32::MAX)")]
    TooManyRows {
        /// Rows of the flattened object.
        rows: usize,
    },
}

/// The shared rule dictionary: index 0 is "no rule".
#[derive(Debug, Clone)]
pub struct RuleDict {
    index: HashMap<RuleEntry, u16>,
    rules: Vec<RuleEntry>,
}

impl Default for RuleDict {
    fn default() -> Self {
        let mut index = HashMap::new();
        index.insert(RuleEntry::NONE, 0);
        Self {
            index,
            rules: vec![RuleEntry::NONE],
        }
    }
}

impl RuleDict {
    /// The index of `rule`, added if it is new; [`FlattenError::RuleDictionaryFull`] when
    /// it is new and the dictionary holds [`MAX_RULES`] rules already.
    pub fn intern(&mut self, rule: RuleEntry) -> Result<u16, FlattenError> {
        if let Some(&i) = self.index.get(&rule) {
            return Ok(i);
        }
        if self.rules.len() >= MAX_RULES as usize {
            return Err(FlattenError::RuleDictionaryFull);
        }
        let i = self.rules.len() as u16;
        self.rules.push(rule);
        self.index.insert(rule, i);
        Ok(i)
    }
    /// The rules by index (index 0 is [`RuleEntry::NONE`]): the contents of the RULES map.
    pub fn rules(&self) -> &[RuleEntry] {
        &self.rules
    }
    /// Number of rules, the "no rule" entry included.
    pub fn len(&self) -> usize {
        self.rules.len()
    }
    /// Always false: the dictionary always holds the "no rule" entry.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Encodes a normalized rule for the kernel ([`sframe_common::codec::encode`] with the
/// architecture's registers), or `None` when the kernel walker cannot apply it.
pub fn encode_rule(rule: &UnwindRule, arch: Arch) -> Option<RuleEntry> {
    sframe_common::codec::encode(rule, arch.dwarf_regs())
}

/// The rule of an AMD64 PLT block that one [`RULE_FLAG_PLT16`] row expresses: 16-byte
/// entries at a 16-aligned start, two rows each, the second (from byte `t`, the `push`)
/// the first with the CFA 8 bytes further, SP-based, FP unchanged. Returns the first
/// row's rule and `t`.
fn plt16_rule(
    table: &UnwindTable,
    f: &crate::table::Function,
    rows: &[CompactRow],
) -> Option<(UnwindRule, u8)> {
    if table.arch != Arch::Amd64
        || f.pc_type != (PcType::Mask { rep_size: 16 })
        || !f.start.is_multiple_of(16)
        || !f.size.is_multiple_of(16)
    {
        return None;
    }
    let [a, b] = rows else {
        return None;
    };
    let t = b.start_offset();
    let first = *table.rules().get(a.rule_index()?)?;
    let second = *table.rules().get(b.rule_index()?)?;
    let shifted = UnwindRule {
        cfa: sframe_common::CfaRule {
            offset: first.cfa.offset.checked_add(8)?,
            ..first.cfa
        },
        ..first
    };
    (a.start_offset() == 0
        && (1..16).contains(&t)
        && first.cfa.base == CfaBase::Sp
        && !first.cfa.deref
        && first.fp == RegRule::Unchanged
        && !first.flags.contains(RuleFlags::SIGNAL)
        && second == shifted)
        .then_some((first, t as u8))
}

/// One object in the kernel layout (row and page indices relative to the object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlatObject {
    /// Object virtual address of the start of page 0 (page-aligned), as
    /// [`ObjectEntry::base`].
    pub base: u64,
    /// Log2 of the page size, as [`ObjectEntry::page_shift`] ([`MIN_PAGE_SHIFT`] to
    /// [`MAX_PAGE_SHIFT`]).
    pub page_shift: u32,
    /// `page_count + 1` entries; the last is `rows.len()`.
    pub pages: Vec<u32>,
    /// The rows of all pages in order (a page need not start with one: the row before
    /// runs on).
    pub rows: Vec<RowEntry>,
    /// Rows of the input table the kernel cannot apply (became "no rule").
    pub unencodable_rows: u64,
    /// PCMASK functions too large to expand (left without rules).
    pub unexpanded_pcmask: u64,
}

impl FlatObject {
    /// Moves the rules of a table flattened with a dictionary of its own (`local`, on
    /// the build thread) into `dict`: every row's rule index is renumbered. Equal rules
    /// have equal indices in both, so the rows stay as merged as they were.
    pub fn renumber(&mut self, local: &RuleDict, dict: &mut RuleDict) -> Result<(), FlattenError> {
        let ids: Vec<u16> = local
            .rules()
            .iter()
            .map(|&r| dict.intern(r))
            .collect::<Result<_, _>>()?;
        for row in &mut self.rows {
            // (Every index came from `local`; one that did not means "no rule".)
            row.rule = ids.get(usize::from(row.rule)).copied().unwrap_or(0);
        }
        Ok(())
    }

    /// Number of pages (`pages.len() - 1`).
    pub fn page_count(&self) -> u32 {
        self.pages.len().saturating_sub(1) as u32
    }
    /// Kernel bytes this object occupies (rows, page entries, its object entry).
    pub fn kernel_bytes(&self) -> u64 {
        (self.rows.len() * 4 + self.pages.len() * 4 + size_of::<ObjectEntry>()) as u64
    }
}

/// Flattens `table` into the kernel layout, interning its rules in `dict`. Empty
/// functions and functions that overlap the previous one are left out; rules the kernel
/// walker cannot apply become "no rule" rows ([`FlatObject::unencodable_rows`]).
pub fn flatten(table: &UnwindTable, dict: &mut RuleDict) -> Result<FlatObject, FlattenError> {
    let functions = table.functions();
    let mut events: Vec<(u64, u16)> = Vec::with_capacity(table.row_count() + functions.len());
    let mut unencodable = 0u64;
    let mut unexpanded = 0u64;
    let push = |events: &mut Vec<(u64, u16)>, addr: u64, rule: u16| {
        if let Some(last) = events.last_mut()
            && last.0 == addr
        {
            last.1 = rule;
            // Merging may now make it equal to the one before.
            if events.len() >= 2 && events.get(events.len() - 2).is_some_and(|e| e.1 == rule) {
                events.pop();
            }
            return;
        }
        if events.last().is_some_and(|l| l.1 == rule) {
            return;
        }
        events.push((addr, rule));
    };
    // Each distinct rule of the table is encoded and interned once, when first used:
    // `None` not yet, `Some(None)` unencodable.
    let mut ids: Vec<Option<Option<u16>>> = vec![None; table.rules().len()];
    let mut last_end = 0u64;
    for (i, f) in functions.iter().enumerate() {
        if f.size == 0 || f.start < last_end {
            continue; // empty or overlapping the previous function
        }
        let end = f.end();
        let mut intern = |row: &CompactRow| -> Result<u16, FlattenError> {
            let Some(k) = row.rule_index() else {
                return Ok(0);
            };
            let id = match ids.get(k).copied().flatten() {
                Some(id) => id,
                None => {
                    let id = match table
                        .rules()
                        .get(k)
                        .and_then(|r| encode_rule(r, table.arch))
                    {
                        Some(e) => Some(dict.intern(e)?),
                        None => None,
                    };
                    if let Some(slot) = ids.get_mut(k) {
                        *slot = Some(id);
                    }
                    id
                }
            };
            Ok(id.unwrap_or_else(|| {
                unencodable += 1;
                0
            }))
        };
        let rows = table.compact_rows(f);
        match f.pc_type {
            PcType::Inc => {
                if rows.first().is_none_or(|r| r.start_offset() != 0) {
                    push(&mut events, f.start, 0);
                }
                for r in rows {
                    let addr = f.start + u64::from(r.start_offset());
                    if addr < end {
                        let rule = intern(r)?;
                        push(&mut events, addr, rule);
                    }
                }
            }
            PcType::Mask { rep_size } if let Some(rule) = plt16_rule(table, f, rows) => {
                let id = match encode_rule(&rule.0, table.arch) {
                    Some(mut e) => {
                        e.flags |= RULE_FLAG_PLT16;
                        e.fp_offset = i16::from(rule.1);
                        dict.intern(e)?
                    }
                    None => {
                        unencodable += 1;
                        0
                    }
                };
                debug_assert_eq!(rep_size, 16);
                push(&mut events, f.start, id);
            }
            PcType::Mask { .. } => {
                let (rep, reps) = f.pc_type.blocks(f.size);
                if rep == 0 || reps * (rows.len() as u64) > MAX_PCMASK_EXPANSION {
                    unexpanded += 1;
                    push(&mut events, f.start, 0);
                } else {
                    let rules: Vec<(u64, u16)> = rows
                        .iter()
                        .map(|r| Ok((u64::from(r.start_offset()), intern(r)?)))
                        .collect::<Result<_, FlattenError>>()?;
                    for k in 0..reps {
                        let block = f.start + k * rep;
                        if rules.first().is_none_or(|r| r.0 != 0) {
                            push(&mut events, block, 0);
                        }
                        for &(off, rule) in &rules {
                            if off < rep && block + off < end {
                                push(&mut events, block + off, rule);
                            }
                        }
                    }
                }
            }
        }
        last_end = end;
        // A "no rule" row where the function ends, unless the next one starts there or
        // only alignment padding (never executed) lies between them.
        let next_start = functions.get(i + 1).map(|n| n.start);
        if next_start != Some(end) && !(f.padding_after() && next_start.is_some()) {
            push(&mut events, end, 0);
        }
    }
    let mut out = FlatObject {
        unencodable_rows: unencodable,
        unexpanded_pcmask: unexpanded,
        ..FlatObject::default()
    };
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        out.page_shift = MAX_PAGE_SHIFT;
        out.pages.push(0);
        return Ok(out);
    };
    let shift = page_shift(first.0, last.0, events.len())?;
    let (base, page_count) = page_span(first.0, last.0, shift);
    out.page_shift = shift;
    out.base = base;
    out.rows.reserve(events.len());
    out.pages.reserve(page_count as usize + 1);
    // A page's rows are the events inside it; a page need not start with one (the last
    // row before it runs on: `find_rule`).
    let mut ev = events.iter().peekable();
    for p in 0..page_count {
        let page_start = out.base + (p << shift);
        let page_end = page_start + (1 << shift);
        out.pages.push(out.rows.len() as u32);
        while let Some(&&(addr, rule)) = ev.peek() {
            if addr >= page_end {
                break;
            }
            out.rows.push(RowEntry {
                addr_low: (addr - page_start) as u16,
                rule,
            });
            ev.next();
        }
    }
    if out.rows.len() > u32::MAX as usize {
        return Err(FlattenError::TooManyRows {
            rows: out.rows.len(),
        });
    }
    out.pages.push(out.rows.len() as u32);
    Ok(out)
}

/// The page-aligned base and the number of pages of `1 << shift` bytes that rows from
/// object address `first` to `last` (`first <= last`) span.
fn page_span(first: u64, last: u64, shift: u32) -> (u64, u64) {
    let base = first & !((1u64 << shift) - 1);
    (base, ((last - base) >> shift) + 1)
}

/// The page shift of an object whose rows (`rows` of them) run from object address
/// `first` to `last`: the smallest from [`MIN_PAGE_SHIFT`] up that leaves at least
/// [`MIN_ROWS_PER_PAGE`] rows per page on average (each page costs a 4-byte entry), and
/// [`MAX_PAGE_SHIFT`] when none does. The finer the pages, the fewer halvings each
/// frame's row search takes.
fn page_shift(first: u64, last: u64, rows: usize) -> Result<u32, FlattenError> {
    let pages = |shift: u32| page_span(first, last, shift).1;
    let rows = (rows as u64).max(MIN_ROWS_PER_PAGE);
    let shift = (MIN_PAGE_SHIFT..MAX_PAGE_SHIFT)
        .find(|&s| {
            let p = pages(s);
            p <= MAX_PAGES_PER_OBJECT && p.saturating_mul(MIN_ROWS_PER_PAGE) <= rows
        })
        .unwrap_or(MAX_PAGE_SHIFT);
    match pages(shift) {
        p if p > MAX_PAGES_PER_OBJECT => Err(FlattenError::TooManyPages { pages: p }),
        _ => Ok(shift),
    }
}

/// Host-side tables over slices, laid out exactly as in the kernel, for the reference
/// walker (tests, fuzzing, `sframe-user` diagnostics).
#[derive(Debug, Default, Clone)]
pub struct HostTables {
    /// MAPPINGS of the one address space walked, sorted by start (as
    /// `ProcessEntry::mappings`).
    pub mappings: Vec<MappingEntry>,
    /// OBJECTS entries, by object id ([`HostTables::add_object`]).
    pub objects: Vec<ObjectEntry>,
    /// PAGES entries of all objects, one after the other (not in blocks).
    pub pages: Vec<u32>,
    /// ROWS entries of all objects, one after the other (not in blocks).
    pub rows: Vec<RowEntry>,
    /// RULES entries: the shared dictionary ([`RuleDict::rules`]), index 0 "no rule".
    pub rules: Vec<RuleEntry>,
    /// The address space's [`sframe_common::layout::addr_bits`] (0: no cut), as
    /// `ProcessEntry::addr_bits` in the kernel.
    pub addr_bits: u32,
}

impl HostTables {
    /// Adds a flattened object; returns its id.
    pub fn add_object(&mut self, flat: &FlatObject) -> u32 {
        let id = self.objects.len() as u32;
        self.objects.push(ObjectEntry {
            base: flat.base,
            page_first: self.pages.len() as u32,
            page_count: flat.page_count(),
            row_first: self.rows.len() as u32,
            page_shift: flat.page_shift,
        });
        self.pages.extend_from_slice(&flat.pages);
        self.rows.extend_from_slice(&flat.rows);
        id
    }
}

/// Read-only: the walk changes nothing (`Tables` takes `&mut self` for BPF maps).
impl Tables for &HostTables {
    fn return_address_mask(&mut self) -> u64 {
        sframe_common::layout::addr_mask(self.addr_bits)
    }
    fn mapping_count(&mut self) -> u32 {
        self.mappings.len() as u32
    }
    fn mapping(&mut self, index: u32) -> Option<MappingEntry> {
        self.mappings.get(index as usize).copied()
    }
    fn object(&mut self, id: u32) -> Option<ObjectEntry> {
        self.objects.get(id as usize).copied()
    }
    fn page_entry(&mut self, index: u32) -> Option<u32> {
        self.pages.get(index as usize).copied()
    }
    fn row(&mut self, index: u32) -> Option<RowEntry> {
        self.rows.get(index as usize).copied()
    }
    fn rule(&mut self, index: u16) -> Option<RuleEntry> {
        self.rules.get(usize::from(index)).copied()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use sframe_common::{
        CfaRule, WalkOutcome,
        step::{Lookup, LookupCache, Regs, Step, WalkState, find_rule, step_rule, walk},
    };

    use super::*;
    use crate::table::{FunctionRows, Row, Source};

    fn rule(cfa_sp: i32) -> UnwindRule {
        UnwindRule {
            cfa: CfaRule::sp(cfa_sp),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        }
    }

    fn func(start: u64, size: u32, rows: &[(u32, Option<UnwindRule>)]) -> FunctionRows {
        FunctionRows {
            start,
            size,
            pc_type: PcType::Inc,
            rows: rows
                .iter()
                .map(|&(start_offset, rule)| Row { start_offset, rule })
                .collect(),
        }
    }

    /// `count` functions of `size` bytes one after the other from `start`, each with rows
    /// at the given offsets whose CFA is SP + the given value.
    fn repeated(start: u64, count: u64, size: u32, rows: &[(u32, i32)]) -> Vec<FunctionRows> {
        let rows: Vec<_> = rows
            .iter()
            .map(|&(at, cfa)| (at, Some(rule(cfa))))
            .collect();
        (0..count)
            .map(|i| func(start + i * u64::from(size), size, &rows))
            .collect()
    }

    fn table(functions: Vec<FunctionRows>) -> UnwindTable {
        UnwindTable::from_functions(Arch::Amd64, Source::EhFrame, functions)
    }

    /// What the table says for `addr` (the model the kernel layout must reproduce).
    fn model(t: &UnwindTable, addr: u64) -> Option<RuleEntry> {
        let f = t
            .functions()
            .iter()
            .find(|f| f.start <= addr && addr < f.end())?;
        let off = match f.pc_type {
            PcType::Inc => addr - f.start,
            PcType::Mask { rep_size } => (addr - f.start) % u64::from(rep_size),
        };
        let row = t.rows(f).rev().find(|r| u64::from(r.start_offset) <= off)?;
        row.rule.and_then(|r| encode_rule(&r, t.arch))
    }

    fn host(t: &UnwindTable, bias: u64) -> (HostTables, FlatObject) {
        let mut dict = RuleDict::default();
        let flat = flatten(t, &mut dict).unwrap();
        let mut h = HostTables::default();
        let id = h.add_object(&flat);
        h.rules = dict.rules().to_vec();
        h.mappings.push(MappingEntry {
            start: bias,
            end: bias + (1 << 40),
            bias,
            object: id,
            flags: 0,
        });
        (h, flat)
    }

    /// The rule the kernel layout gives `pc` (a PLT rule resolved there), `None` for
    /// "no rule"; panics on any other lookup outcome.
    fn rule_in(h: &mut HostTables, pc: u64) -> Option<RuleEntry> {
        match find_rule(&mut &*h, pc, &mut { LookupCache::EMPTY }) {
            Lookup::Rule(r) => Some(r.at(pc)),
            Lookup::NoRule => None,
            other => panic!("{pc:#x}: {other:?}"),
        }
    }

    fn check_every_address(t: &UnwindTable, from: u64, to: u64) {
        let bias = 0x5555_0000_0000;
        let (mut h, _) = host(t, bias);
        for addr in from..to {
            assert_eq!(
                rule_in(&mut h, addr + bias),
                model(t, addr),
                "address {addr:#x}"
            );
        }
    }

    #[test]
    fn lookups_match_the_table_at_every_address() {
        let t = table(vec![
            func(
                0x1000,
                0x20,
                &[
                    (0, Some(rule(8))),
                    (1, Some(rule(16))),
                    (0x1f, Some(rule(8))),
                ],
            ),
            // Adjacent function starting with the same rule: merged across the boundary.
            func(0x1020, 0x10, &[(0, Some(rule(8))), (4, Some(rule(32)))]),
            // A gap, then a function whose first row starts late and with a no-rule range.
            func(
                0x1100,
                0x40,
                &[(8, Some(rule(16))), (0x10, None), (0x20, Some(rule(24)))],
            ),
        ]);
        check_every_address(&t, 0xf00, 0x1200);
    }

    #[test]
    fn a_table_flattened_with_its_own_dictionary_renumbers_into_the_shared_one() {
        let t = table(vec![
            func(0x1000, 0x20, &[(0, Some(rule(8))), (1, Some(rule(16)))]),
            func(0x1020, 0x10, &[(0, Some(rule(8))), (4, Some(rule(32)))]),
            func(0x1100, 0x40, &[(8, Some(rule(24))), (0x10, None)]),
        ]);
        // The shared dictionary already holds other objects' rules, one of them this
        // table's too (at another index than in the table's own).
        let mut shared = RuleDict::default();
        for r in [rule(48), rule(32), rule(56)] {
            shared
                .intern(encode_rule(&r, Arch::Amd64).unwrap())
                .unwrap();
        }
        let mut direct_dict = shared.clone();
        let direct = flatten(&t, &mut direct_dict).unwrap();
        let mut local = RuleDict::default();
        let mut moved = flatten(&t, &mut local).unwrap();
        moved.renumber(&local, &mut shared).unwrap();
        assert_eq!(moved, direct);
        assert_eq!(shared.rules(), direct_dict.rules());
        // Renumbering keeps every row's rule (not only the layout).
        for (row, local_row) in moved
            .rows
            .iter()
            .zip(&flatten(&t, &mut RuleDict::default()).unwrap().rows)
        {
            assert_eq!(
                shared.rules()[usize::from(row.rule)],
                local.rules()[usize::from(local_row.rule)]
            );
        }
        // A full shared dictionary refuses the new rules.
        let mut full = RuleDict::default();
        // (Offsets none of the table's rules has.)
        let mut cfa = 1000;
        while full.len() < MAX_RULES as usize {
            cfa += 8;
            full.intern(encode_rule(&rule(cfa), Arch::Amd64).unwrap())
                .unwrap();
        }
        let mut again = flatten(&t, &mut RuleDict::default()).unwrap();
        assert!(matches!(
            again.renumber(&local, &mut full),
            Err(FlattenError::RuleDictionaryFull)
        ));
    }

    #[test]
    fn padding_after_a_function_needs_no_row_and_merges_with_the_next() {
        let fns = vec![
            func(
                0x1000,
                0x1b,
                &[
                    (0, Some(rule(8))),
                    (1, Some(rule(16))),
                    (0x1a, Some(rule(8))),
                ],
            ),
            // Padding 0x101b..0x1020, then a function starting with the same rule.
            func(0x1020, 0x10, &[(0, Some(rule(8))), (4, Some(rule(32)))]),
            // The last function's trailing gap keeps its "no rule" row.
            func(0x1040, 0x10, &[(0, Some(rule(8)))]),
        ];
        let plain = table(fns.clone());
        let mut padded = table(fns);
        padded.mark_padding_after(0);
        padded.mark_padding_after(2);
        let mut dict = RuleDict::default();
        let a = flatten(&plain, &mut dict).unwrap();
        let b = flatten(&padded, &mut dict).unwrap();
        // The terminator at 0x101b and the next function's first row are gone.
        assert_eq!(a.rows.len(), b.rows.len() + 2, "{:?}\n{:?}", a.rows, b.rows);
        // Everywhere but the padding, the same rules; in the padding, the last rule of
        // the function before it.
        let bias = 0x5555_0000_0000;
        let (mut h, _) = host(&padded, bias);
        for addr in 0xf00..0x1100u64 {
            let got = rule_in(&mut h, addr + bias);
            let want = if (0x101b..0x1020).contains(&addr) {
                encode_rule(&rule(8), Arch::Amd64)
            } else {
                model(&padded, addr)
            };
            assert_eq!(got, want, "address {addr:#x}");
        }
    }

    #[test]
    fn rules_carry_across_pages() {
        // One function spanning three 64 KiB pages with rows only in the first.
        let t = table(vec![
            func(
                0xfff0,
                0x30000,
                &[(0, Some(rule(8))), (0x20, Some(rule(48)))],
            ),
            func(0x40000, 0x10, &[(0, Some(rule(8)))]),
        ]);
        let (_, flat) = host(&t, 0);
        assert_eq!(flat.base, 0);
        assert_eq!(flat.page_count(), 5);
        // Rows at 0xfff0, 0x10010, 0x3fff0 (the end), 0x40000 and 0x40010: page 2 holds
        // none (the rule of 0x10010 runs on through it), pages 1 and 3 none at their start.
        assert_eq!(flat.pages, [0, 1, 2, 2, 3, 5]);
        for addr in [
            0xffef, 0xfff0, 0x1000f, 0x10010, 0x1ffff, 0x20000, 0x3ffef, 0x3fff0,
        ] {
            let bias = 0x5555_0000_0000;
            let (h, _) = host(&t, bias);
            let got = match find_rule(&mut &h, addr + bias, &mut { LookupCache::EMPTY }) {
                Lookup::Rule(r) => Some(r),
                _ => None,
            };
            assert_eq!(got, model(&t, addr), "address {addr:#x}");
        }
    }

    #[test]
    fn dense_code_gets_finer_pages() {
        // 64 functions of 16 bytes with 4 rows each (64 rows per 256 bytes), starting off
        // a page boundary so that pages begin inside functions, between two rows.
        let t = table(repeated(
            0x1_0008,
            64,
            16,
            &[(0, 8), (1, 16), (4, 24), (12, 40)],
        ));
        let (_, flat) = host(&t, 0);
        assert!(flat.page_shift <= MIN_PAGE_SHIFT + 1, "{}", flat.page_shift);
        let pages = u64::from(flat.page_count());
        assert!(flat.rows.len() as u64 >= MIN_ROWS_PER_PAGE * pages);
        // No page starts with a row: each runs on from the page before.
        for p in 1..flat.page_count() as usize {
            assert_ne!(flat.rows[flat.pages[p] as usize].addr_low, 0, "page {p}");
        }
        // The same rules as the table at every address, page boundaries included.
        check_every_address(&t, 0xff00, 0x1_0008 + 64 * 16 + 0x100);
    }

    #[test]
    fn page_shift_keeps_rows_per_page_and_the_page_limit() {
        for (first, last, rows) in [
            (0, 0, 1),
            (0x1000, 0x1fff, 16),
            (0x1000, 0x1_0fff, 4096),
            (0x1000, 0x10_0fff, 4096),
            (0x1000, 0x10_0fff, 1 << 20),
            (0, u64::from(u32::MAX), 1 << 24),
            (0x1234, 0x8000_0000, 2),
        ] {
            let shift = page_shift(first, last, rows).unwrap();
            assert!((MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&shift));
            let (_, pages) = page_span(first, last, shift);
            assert!(pages <= MAX_PAGES_PER_OBJECT, "{first:#x}..{last:#x}");
            if shift > MIN_PAGE_SHIFT {
                // Finer pages would have had too few rows each, or too many pages.
                let (_, finer) = page_span(first, last, shift - 1);
                assert!(
                    finer * MIN_ROWS_PER_PAGE > (rows as u64).max(MIN_ROWS_PER_PAGE)
                        || finer > MAX_PAGES_PER_OBJECT,
                    "{first:#x}..{last:#x} {rows}: shift {shift}"
                );
            }
            if shift < MAX_PAGE_SHIFT {
                assert!(pages * MIN_ROWS_PER_PAGE <= (rows as u64).max(MIN_ROWS_PER_PAGE));
            }
        }
        // More than 4 GiB of address space is refused, as before.
        assert!(matches!(
            page_shift(0, 1 << 33, 1 << 20),
            Err(FlattenError::TooManyPages { .. })
        ));
    }

    #[test]
    fn pcmask_blocks_are_expanded() {
        // Not the AMD64 PLT shape (the second row is not the first + 8): expanded.
        let mut plt = func(0x2000, 0x40, &[(0, Some(rule(8))), (11, Some(rule(24)))]);
        plt.pc_type = PcType::Mask { rep_size: 16 };
        let t = table(vec![plt]);
        check_every_address(&t, 0x1ff0, 0x2050);
        let flat = flatten(&t, &mut RuleDict::default()).unwrap();
        assert!(flat.rows.len() >= 8, "{:?}", flat.rows);
    }

    #[test]
    fn amd64_plt_blocks_are_one_row() {
        // PLT0-like function, then 64 entries of `jmp *GOT; push; jmp` (CFA sp+8, then
        // sp+16 from byte 11), then the same shape misaligned, which is expanded.
        let plt0 = func(0x2000, 0x10, &[(0, Some(rule(16))), (6, Some(rule(24)))]);
        let mut entries = func(0x2010, 0x400, &[(0, Some(rule(8))), (11, Some(rule(16)))]);
        entries.pc_type = PcType::Mask { rep_size: 16 };
        let mut odd = func(0x3008, 0x20, &[(0, Some(rule(8))), (11, Some(rule(16)))]);
        odd.pc_type = PcType::Mask { rep_size: 16 };
        let t = table(vec![plt0, entries, odd]);
        check_every_address(&t, 0x1ff0, 0x3040);
        let flat = flatten(&t, &mut RuleDict::default()).unwrap();
        // PLT0's two rows, one for the block, a terminator, the odd block's 4 rows and
        // its terminator (plus the page's first row).
        assert!(flat.rows.len() <= 12, "{:?}", flat.rows);
        // The walker applies it: at the push, the RA is 16 bytes up the stack.
        let bias = 0x5555_0000_0000;
        let (h, _) = host(&t, bias);
        let Lookup::Rule(r) = find_rule(&mut &h, bias + 0x2010 + 5 * 16 + 12, &mut {
            LookupCache::EMPTY
        }) else {
            panic!("no rule in the PLT");
        };
        let regs = Regs {
            pc: bias + 0x2010 + 5 * 16 + 12,
            sp: 0x7ff0_0000,
            fp: 1,
        };
        let mut read = |a: u64| (a == 0x7ff0_0008).then_some(bias + 0x1234);
        match step_rule(&r, &regs, None, &mut read) {
            Ok(Step::Caller { regs, .. }) => {
                assert_eq!((regs.pc, regs.sp), (bias + 0x1234, 0x7ff0_0010));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unencodable_rules_become_no_rule_and_are_counted() {
        let mut r = rule(8);
        r.ra = RegRule::AtReg { reg: 3, offset: 0 };
        let t = table(vec![func(0x1000, 0x10, &[(0, Some(r))])]);
        let mut dict = RuleDict::default();
        let flat = flatten(&t, &mut dict).unwrap();
        assert_eq!(flat.unencodable_rows, 1);
        assert_eq!(dict.len(), 1, "only the no-rule entry");
        // The same in an AMD64 PLT block (one row for all its entries).
        let mut second = r;
        second.cfa.offset += 8;
        let mut plt = func(0x2000, 0x40, &[(0, Some(r)), (11, Some(second))]);
        plt.pc_type = PcType::Mask { rep_size: 16 };
        let flat = flatten(&table(vec![plt]), &mut dict).unwrap();
        assert_eq!(flat.unencodable_rows, 1);
        assert_eq!(dict.len(), 1, "only the no-rule entry");
    }

    #[test]
    fn bytes_per_row_stay_near_four() {
        let functions = repeated(0x1000, 1000, 0x40, &[(0, 8), (1, 16), (8, 24), (0x3f, 8)]);
        let (_, flat) = host(&table(functions), 0);
        let per_row = flat.kernel_bytes() as f64 / flat.rows.len() as f64;
        assert!(per_row < 4.1, "{per_row} bytes per row");
    }

    /// A synthetic process: `main` calls `f` calls `g`; RA rules at CFA-8.
    struct Synth {
        tables: HostTables,
        memory: HashMap<u64, u64>,
    }

    const BIAS: u64 = 0x4000_0000;

    fn synth() -> Synth {
        let mut outermost = rule(8);
        outermost.ra = RegRule::Undefined;
        let t = table(vec![
            func(0x1000, 0x100, &[(0, Some(outermost))]), // _start
            func(0x1100, 0x100, &[(0, Some(rule(8))), (1, Some(rule(32)))]), // main
            func(0x1200, 0x100, &[(0, Some(rule(8))), (4, Some(rule(24)))]), // f
            func(0x1300, 0x100, &[(0, Some(rule(16)))]),  // g
        ]);
        let (tables, _) = host(&t, BIAS);
        Synth {
            tables,
            memory: HashMap::new(),
        }
    }

    fn run(s: &mut Synth, regs: Regs) -> (WalkOutcome, Vec<u64>) {
        let mut st = Box::new(WalkState::default());
        let memory = s.memory.clone();
        let outcome = walk(&mut st, regs, &mut &s.tables, &mut |a| {
            memory.get(&a).copied()
        });
        let frames = st.stack.frames[..st.stack.len as usize].to_vec();
        (outcome, frames)
    }

    #[test]
    fn reference_walker_unwinds_a_synthetic_stack_to_the_outermost_frame() {
        let mut s = synth();
        // g at 0x1310 with CFA = sp + 16: RA (into f) at sp + 8.
        let sp = 0x7fff_0000u64;
        s.memory.insert(sp + 8, BIAS + 0x1250); // in f, after row 4: CFA = sp' + 24
        let sp_f = sp + 16;
        s.memory.insert(sp_f + 16, BIAS + 0x1150); // RA into main: CFA = sp'' + 32
        let sp_main = sp_f + 24;
        s.memory.insert(sp_main + 24, BIAS + 0x1010); // RA into _start
        let (outcome, frames) = run(
            &mut s,
            Regs {
                pc: BIAS + 0x1310,
                sp,
                fp: 0,
            },
        );
        assert_eq!(outcome, WalkOutcome::Complete);
        assert_eq!(
            frames,
            vec![BIAS + 0x1310, BIAS + 0x1250, BIAS + 0x1150, BIAS + 0x1010]
        );
    }

    #[test]
    fn hostile_stacks_always_end_with_an_outcome() {
        let sp = 0x7fff_0000u64;
        // Unreadable return address.
        let mut s = synth();
        assert_eq!(
            run(
                &mut s,
                Regs {
                    pc: BIAS + 0x1310,
                    sp,
                    fp: 0
                }
            )
            .0,
            WalkOutcome::ReadFault
        );
        // A return address into no mapping.
        let mut s = synth();
        s.memory.insert(sp + 8, 0x10);
        assert_eq!(
            run(
                &mut s,
                Regs {
                    pc: BIAS + 0x1310,
                    sp,
                    fp: 0
                }
            )
            .0,
            WalkOutcome::NoMapping
        );
        // A return address of 0.
        let mut s = synth();
        s.memory.insert(sp + 8, 0);
        assert_eq!(
            run(
                &mut s,
                Regs {
                    pc: BIAS + 0x1310,
                    sp,
                    fp: 0
                }
            )
            .0,
            WalkOutcome::ZeroReturnAddress
        );
        // A loop: every frame returns into g with its stack pointing at itself. The CFA
        // rises each step, so the walk is bounded by MAX_FRAMES or the memory.
        let mut s = synth();
        for k in 0..1000u64 {
            s.memory.insert(sp + 8 + 16 * k, BIAS + 0x1310);
        }
        let (outcome, frames) = run(
            &mut s,
            Regs {
                pc: BIAS + 0x1310,
                sp,
                fp: 0,
            },
        );
        assert_eq!(outcome, WalkOutcome::Truncated);
        assert_eq!(frames.len(), sframe_common::budget::MAX_FRAMES);
        // Frame-pointer fallback with a frame pointer pointing below the stack pointer.
        let mut s = synth();
        s.tables.mappings[0].object = NO_OBJECT;
        assert_eq!(
            run(
                &mut s,
                Regs {
                    pc: BIAS + 0x1310,
                    sp,
                    fp: sp - 64
                }
            )
            .0,
            WalkOutcome::NoProgress
        );
        // Frame-pointer chain to a zero frame pointer.
        let mut s = synth();
        s.tables.mappings[0].object = NO_OBJECT;
        s.memory.insert(sp + 8, BIAS + 0x1250);
        s.memory.insert(sp, 0);
        let (outcome, frames) = run(
            &mut s,
            Regs {
                pc: BIAS + 0x1310,
                sp,
                fp: sp,
            },
        );
        assert_eq!(outcome, WalkOutcome::FramePointerEnd);
        assert_eq!(frames.len(), 2);
    }

    #[test]
    fn the_reference_walker_terminates_on_random_tables_and_memory() {
        // A tiny deterministic PRNG (no dependency): xorshift64*.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..200 {
            let mut s = synth();
            for r in s.tables.rows.iter_mut() {
                r.rule = (next() % 6) as u16;
            }
            for i in 0..64 {
                s.memory
                    .insert(0x7fff_0000 + 8 * i, BIAS + 0x1000 + next() % 0x400);
            }
            let regs = Regs {
                pc: BIAS + 0x1000 + next() % 0x400,
                sp: 0x7fff_0000,
                fp: 0x7fff_0000 + (next() % 64) * 8,
            };
            let (_, frames) = run(&mut s, regs);
            assert!(!frames.is_empty() && frames.len() <= sframe_common::budget::MAX_FRAMES);
        }
    }
}
