//! The in-memory unwind table of one object: functions and their rows, in the normalized
//! rule type. The SFrame reader, the `.eh_frame` deriver and the PLT synthesizer produce
//! it; the SFrame writer and the BPF map flattener consume it.
//!
//! Layout, chosen for memory (issue 4: a table should cost at most twice the size of its
//! rows encoded as SFrame, about 7.5 bytes per row): a function is a 24-byte record
//! pointing into one array of 6-byte rows (start offset, 16-bit rule index), and the
//! rules are kept once per table (an object has a few hundred distinct rules for tens
//! of thousands of rows; a table holds at most [`MAX_TABLE_RULES`], one fewer than the
//! kernel's rule dictionary, whose index 0 is "no rule"). A row that held its
//! [`UnwindRule`] would take 36 bytes, plus a vector per function. [`Row`] and
//! [`FunctionRows`] are the owned value forms, for building and comparing tables.

use sframe_common::UnwindRule;

/// Most distinct rules one table holds (16-bit row indices, 0 meaning "no rule"). Real
/// objects have hundreds; the kernel's rule dictionary, shared by all objects, holds
/// 65,536. Rows of rules past the limit are stored without a rule and counted
/// ([`TableBuilder::rows_over_rule_limit`]).
pub const MAX_TABLE_RULES: usize = u16::MAX as usize;

/// Architecture of the object the rows describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86-64.
    Amd64,
    /// AArch64.
    Aarch64 {
        /// Big-endian (`aarch64_be`); else little-endian.
        big_endian: bool,
    },
    /// s390x (big-endian).
    S390x,
}

impl Arch {
    /// The ELF `e_machine` of objects of this architecture.
    pub const fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => object::elf::EM_X86_64,
            Arch::Aarch64 { .. } => object::elf::EM_AARCH64,
            Arch::S390x => object::elf::EM_S390,
        }
    }

    /// The architecture's DWARF register numbers.
    pub fn dwarf_regs(self) -> &'static sframe_common::dwarf::DwarfRegs {
        use sframe_common::dwarf;
        match self {
            Arch::Amd64 => &dwarf::AMD64,
            Arch::Aarch64 { .. } => &dwarf::AARCH64,
            Arch::S390x => &dwarf::S390X,
        }
    }
}

/// How a function's rows are matched against a PC (SFrame's FDE types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PcType {
    /// Row start offsets are offsets from the function start (SFRAME_FDE_TYPE_PCINC).
    Inc,
    /// Row start offsets are matched against `(pc - start) % rep_size`
    /// (SFRAME_FDE_TYPE_PCMASK: a block of identical PLT entries).
    Mask {
        /// Size in bytes of the repeating block (`sfde_func_rep_size`).
        rep_size: u8,
    },
}

impl PcType {
    /// Where a function's rows repeat, for a function of `size` bytes: `(block bytes,
    /// blocks)`. PCINC: one block, the function. PCMASK: `size.div_ceil(rep_size)`
    /// blocks of `rep_size` bytes, the last one cut at the function's end (a lookup
    /// matches `(pc - start) % rep_size` for every PC of the function, a partial last
    /// entry included, as libsframe's does). A PCMASK of `rep_size` 0 covers nothing.
    pub fn blocks(self, size: u32) -> (u64, u64) {
        match self {
            Self::Inc => (u64::from(size), 1),
            Self::Mask { rep_size: 0 } => (0, 0),
            Self::Mask { rep_size } => {
                let rep = u64::from(rep_size);
                (rep, u64::from(size).div_ceil(rep))
            }
        }
    }
}

/// The code where one row holds, as offsets `[lo, hi)` from the function's start, one
/// range per block (see [`PcType::blocks`]), in order: the row starts at `start` in
/// each block and ends at `next` (the next row's start) or the block's end, cut at the
/// function's end. The one definition of row coverage that the flattener, the
/// statistics, the padding scan and `sframe-user check` share.
pub fn row_ranges(
    size: u32,
    pc_type: PcType,
    start: u32,
    next: Option<u32>,
) -> impl Iterator<Item = (u64, u64)> + Clone {
    let (block, blocks) = pc_type.blocks(size);
    let size = u64::from(size);
    let lo = u64::from(start).min(block);
    let hi = next.map_or(block, |n| u64::from(n).min(block));
    (0..blocks).filter_map(move |k| {
        let base = k * block;
        let (l, h) = ((base + lo).min(size), (base + hi).min(size));
        (l < h).then_some((l, h))
    })
}

/// One row: from `start_offset` (relative to the function start) to the next row's start
/// or the function end, the rule holds. `rule: None` is an explicit "no rule here" range
/// (CFI that no supported rule expresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// Start of the row in bytes from the function start (for PCMASK, from the start of
    /// each block).
    pub start_offset: u32,
    /// The rule; `None` for "no rule here".
    pub rule: Option<UnwindRule>,
}

/// A function with its rows, owned: what tables are built from
/// ([`UnwindTable::from_functions`], [`TableBuilder::push_function`]) and compared as
/// ([`UnwindTable::to_function_rows`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FunctionRows {
    /// Start address (virtual address in the object, before any load bias).
    pub start: u64,
    /// Size in bytes.
    pub size: u32,
    /// How the rows match a PC.
    pub pc_type: PcType,
    /// The rows, sorted by `start_offset`.
    pub rows: Vec<Row>,
}

impl FunctionRows {
    /// End address (exclusive): `start + size`, saturating.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(u64::from(self.size))
    }
}

/// A function of a table: its absolute start address (virtual address in the object,
/// before any load bias), its size in bytes and its PC type. Its rows, sorted by
/// `start_offset`, are [`UnwindTable::rows`].
#[derive(Clone, Copy, Debug)]
pub struct Function {
    /// Start address (virtual address in the object, before any load bias).
    pub start: u64,
    /// Size in bytes.
    pub size: u32,
    /// How the rows match a PC.
    pub pc_type: PcType,
    /// The bytes from its end to the next function's start are alignment padding
    /// (never executed): the kernel layout then needs no "no rule" row between them.
    padding_after: bool,
    first_row: u32,
    row_count: u32,
}

const _: () = assert!(size_of::<Function>() == 24);

impl Function {
    /// A function whose rows are `row_count` rows from `first_row` of the table (or
    /// [`TableBuilder`]) it is used with.
    pub(crate) fn from_parts(
        start: u64,
        size: u32,
        pc_type: PcType,
        (first_row, row_count): (u32, u32),
    ) -> Self {
        Self {
            start,
            size,
            pc_type,
            padding_after: false,
            first_row,
            row_count,
        }
    }
    /// Whether the gap up to the next function is alignment padding (see
    /// [`UnwindTable::mark_padding_after`]).
    pub fn padding_after(&self) -> bool {
        self.padding_after
    }
    /// End address (exclusive): `start + size`, saturating.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(u64::from(self.size))
    }
    /// Number of rows.
    pub fn row_count(&self) -> usize {
        self.row_count as usize
    }
    /// (first row, row count) in the table's row array.
    pub(crate) fn row_span(&self) -> (u32, u32) {
        (self.first_row, self.row_count)
    }
    /// The same address range and PC type.
    pub fn same_range(&self, other: &Function) -> bool {
        (self.start, self.size, self.pc_type) == (other.start, other.size, other.pc_type)
    }
}

/// A row as stored, in 6 bytes: start offset (two 16-bit halves, so that the row is
/// 2-byte aligned) and rule index (0: no rule; `i + 1`: the table's rule `i`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompactRow {
    start_low: u16,
    start_high: u16,
    rule: u16,
}

const _: () = assert!(size_of::<CompactRow>() == 6);

impl CompactRow {
    fn new(start_offset: u32, rule: u16) -> Self {
        Self {
            start_low: start_offset as u16,
            start_high: (start_offset >> 16) as u16,
            rule,
        }
    }
    /// The same row starting at `start_offset`.
    pub(crate) fn at(self, start_offset: u32) -> Self {
        Self::new(start_offset, self.rule)
    }
    /// Start of the row in bytes from the function start (for PCMASK, from the start of
    /// each block).
    #[inline]
    pub fn start_offset(&self) -> u32 {
        u32::from(self.start_low) | u32::from(self.start_high) << 16
    }
    /// Index of the row's rule in [`UnwindTable::rules`]; `None` for "no rule here".
    #[inline]
    pub fn rule_index(&self) -> Option<usize> {
        usize::from(self.rule).checked_sub(1)
    }
}

/// Where a table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// An `.sframe` section.
    SFrame {
        /// Its SFrame version.
        version: u8,
    },
    /// `.eh_frame` (with any `.debug_frame` and PLT rows added).
    EhFrame,
    /// `.debug_frame` (own or of a separate debug file), when `.eh_frame` gave no
    /// functions (PLT rows may be added).
    DebugFrame,
    /// Only synthesized PLT rows: no CFI gave functions.
    Synthesized,
}

impl Source {
    /// Where the rows came from, for logs and reports.
    pub fn describe(self) -> &'static str {
        match self {
            Source::SFrame { version: 1 } => "its .sframe (version 1)",
            Source::SFrame { version: 2 } => "its .sframe (version 2)",
            Source::SFrame { .. } => "its .sframe",
            Source::EhFrame => ".eh_frame",
            Source::DebugFrame => ".debug_frame",
            Source::Synthesized => "synthesized PLT rows",
        }
    }
}

/// All functions of one object, sorted by start address, non-overlapping (the producers'
/// contract; the table does not reorder what it is given).
#[derive(Clone, Debug)]
pub struct UnwindTable {
    /// Architecture of the code.
    pub arch: Arch,
    /// Where the rows came from.
    pub source: Source,
    functions: Vec<Function>,
    rows: Vec<CompactRow>,
    rules: Vec<UnwindRule>,
}

impl UnwindTable {
    /// An empty table.
    pub fn new(arch: Arch, source: Source) -> Self {
        Self {
            arch,
            source,
            functions: Vec::new(),
            rows: Vec::new(),
            rules: Vec::new(),
        }
    }

    /// A table of these functions, in the given order.
    pub fn from_functions(
        arch: Arch,
        source: Source,
        functions: impl IntoIterator<Item = FunctionRows>,
    ) -> Self {
        let mut b = TableBuilder::new(arch, source);
        for f in functions {
            b.push_function(&f);
        }
        b.finish()
    }

    /// The functions (sorted by start address: the producers' contract).
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// The rows of `f`, a function of this table.
    pub fn rows(&self, f: &Function) -> Rows<'_> {
        Rows {
            rows: self.compact_rows(f),
            rules: &self.rules,
        }
    }

    /// The rows of `f` as stored (rule indices into [`UnwindTable::rules`]).
    pub fn compact_rows(&self, f: &Function) -> &[CompactRow] {
        let first = f.first_row as usize;
        self.rows
            .get(first..first + f.row_count as usize)
            .unwrap_or_default()
    }

    /// The distinct rules the rows refer to.
    pub fn rules(&self) -> &[UnwindRule] {
        &self.rules
    }

    /// Number of rows, all functions together.
    pub fn row_count(&self) -> usize {
        self.rows.len()
    }

    /// `f` with its rows, owned.
    pub fn function_rows(&self, f: &Function) -> FunctionRows {
        FunctionRows {
            start: f.start,
            size: f.size,
            pc_type: f.pc_type,
            rows: self.rows(f).collect(),
        }
    }

    /// The function containing `pc` and the row that holds there (for PCMASK
    /// functions, the row of `(pc - start) % rep_size`), as SFrame's lookup finds it;
    /// `None` outside every function.
    pub fn find_row(&self, pc: u64) -> Option<(&Function, Row)> {
        let i = self.functions.partition_point(|f| f.end() <= pc);
        let f = self.functions.get(i).filter(|f| f.start <= pc)?;
        let off = pc - f.start;
        let off = match f.pc_type {
            PcType::Inc => off,
            PcType::Mask { rep_size } => off % u64::from(rep_size.max(1)),
        };
        let rows = self.compact_rows(f);
        let k = rows
            .partition_point(|r| u64::from(r.start_offset()) <= off)
            .checked_sub(1)?;
        Some((f, self.rows(f).get(k)?))
    }

    /// Marks function `i` as followed by alignment padding up to the next function
    /// (found by the object's code bytes; `ehframe::mark_padding`).
    pub fn mark_padding_after(&mut self, i: usize) {
        if let Some(f) = self.functions.get_mut(i) {
            f.padding_after = true;
        }
    }

    /// Every function with its rows, owned (to compare or edit a table).
    pub fn to_function_rows(&self) -> Vec<FunctionRows> {
        self.functions
            .iter()
            .map(|f| self.function_rows(f))
            .collect()
    }

    /// Heap bytes the table holds (vector capacities; allocator overhead aside).
    pub fn heap_bytes(&self) -> usize {
        self.functions.capacity() * size_of::<Function>()
            + self.rows.capacity() * size_of::<CompactRow>()
            + self.rules.capacity() * size_of::<UnwindRule>()
    }

    /// A table of the functions of `self` and of `other` for which `keep` says true,
    /// merged in start-address order (`self`'s first on equal starts).
    pub fn merged_with(
        &self,
        other: &UnwindTable,
        mut keep: impl FnMut(&Function) -> bool,
    ) -> UnwindTable {
        let mut b = TableBuilder::new(self.arch, self.source);
        b.reserve(
            self.functions.len() + other.functions.len(),
            self.rows.len() + other.rows.len(),
        );
        let mut theirs = other.functions.iter().filter(|f| keep(f)).peekable();
        for f in &self.functions {
            while let Some(o) = theirs.next_if(|o| o.start < f.start) {
                b.push_from(other, o);
            }
            b.push_from(self, f);
        }
        for o in theirs {
            b.push_from(other, o);
        }
        b.finish()
    }

    /// The table without the functions for which `keep` says false.
    pub fn retain(&mut self, mut keep: impl FnMut(&Function) -> bool) {
        let mut b = TableBuilder::new(self.arch, self.source);
        for f in &self.functions {
            if keep(f) {
                b.push_from(self, f);
            }
        }
        *self = b.finish();
    }
}

/// Tables are equal when they have the same architecture, source and functions with the
/// same rows (however the rules are numbered).
impl PartialEq for UnwindTable {
    fn eq(&self, other: &Self) -> bool {
        self.arch == other.arch
            && self.source == other.source
            && self.functions.len() == other.functions.len()
            && self
                .functions
                .iter()
                .zip(&other.functions)
                .all(|(a, b)| a.same_range(b) && self.rows(a).eq(other.rows(b)))
    }
}

impl Eq for UnwindTable {}

/// The rows of one function, as [`Row`] values.
#[derive(Clone, Debug)]
pub struct Rows<'a> {
    rows: &'a [CompactRow],
    rules: &'a [UnwindRule],
}

impl<'a> Rows<'a> {
    fn resolve(&self, r: &CompactRow) -> Row {
        Row {
            start_offset: r.start_offset(),
            rule: r.rule_index().and_then(|i| self.rules.get(i).copied()),
        }
    }
    /// Row `i` (of those not yet iterated).
    pub fn get(&self, i: usize) -> Option<Row> {
        self.rows.get(i).map(|r| self.resolve(r))
    }
    /// Rows `lo..hi` (of those not yet iterated), `None` when out of range.
    pub fn sub(&self, lo: usize, hi: usize) -> Option<Rows<'a>> {
        Some(Rows {
            rows: self.rows.get(lo..hi)?,
            rules: self.rules,
        })
    }
}

impl Iterator for Rows<'_> {
    type Item = Row;
    #[inline]
    fn next(&mut self) -> Option<Row> {
        let (first, rest) = self.rows.split_first()?;
        self.rows = rest;
        Some(self.resolve(first))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.rows.len(), Some(self.rows.len()))
    }
}

impl DoubleEndedIterator for Rows<'_> {
    fn next_back(&mut self) -> Option<Row> {
        let (last, rest) = self.rows.split_last()?;
        self.rows = rest;
        Some(self.resolve(last))
    }
}

impl ExactSizeIterator for Rows<'_> {}

/// Builds an [`UnwindTable`] function by function, keeping each distinct rule once.
#[derive(Debug)]
pub struct TableBuilder {
    table: UnwindTable,
    index: RuleIndex,
    /// Rows whose rule was new when the table already had [`MAX_TABLE_RULES`].
    over_limit: u64,
}

/// The rules of a table by value: an open-addressing hash set of 16-bit rule numbers
/// (`i + 1` for the table's rule `i`, 0 for an empty slot) over the table's rule vector,
/// kept at most half full. 2 bytes a slot instead of the 40 a map entry with the rule
/// would take: a few KiB for an object's few hundred rules.
#[derive(Debug, Default)]
struct RuleIndex {
    slots: Vec<u16>,
}

/// A hash of a rule, spread over the high bits (the slot is taken from the top).
#[inline(always)]
fn rule_hash(r: &UnwindRule) -> u64 {
    use sframe_common::{CfaBase, RegRule};
    let reg = |x: &RegRule| -> u64 {
        match *x {
            RegRule::Unchanged => 0,
            RegRule::AtCfa(o) => 1 | u64::from(o as u32) << 8,
            RegRule::ValCfa(o) => 2 | u64::from(o as u32) << 8,
            RegRule::InReg(n) => 3 | u64::from(n) << 8,
            RegRule::AtReg { reg, offset } => {
                4 | u64::from(reg) << 8 | u64::from(offset as u32) << 24
            }
            RegRule::Undefined => 5,
        }
    };
    let base = match r.cfa.base {
        CfaBase::Sp => 0,
        CfaBase::Fp => 1,
        CfaBase::Reg(n) => 2 + u64::from(n),
    };
    let h = base
        ^ u64::from(r.cfa.offset as u32) << 20
        ^ u64::from(r.cfa.deref) << 19
        ^ reg(&r.ra).rotate_left(13)
        ^ reg(&r.fp).rotate_left(37)
        ^ u64::from(r.flags.0) << 58;
    h.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl RuleIndex {
    /// The slot holding `rule`, or the empty slot where it belongs.
    #[inline(always)]
    fn probe(&self, rule: &UnwindRule, rules: &[UnwindRule]) -> usize {
        let mask = self.slots.len() - 1;
        let bits = self.slots.len().trailing_zeros();
        let mut i = (rule_hash(rule) >> (64 - bits)) as usize;
        loop {
            match self.slots.get(i).copied().unwrap_or(0) {
                0 => return i,
                n if rules.get(usize::from(n) - 1) == Some(rule) => return i,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The number of `rule` (`i + 1`), adding it to `rules` when new; 0 when it is new
    /// and `rules` holds [`MAX_TABLE_RULES`] already.
    #[inline(always)]
    fn intern(&mut self, rule: UnwindRule, rules: &mut Vec<UnwindRule>) -> u16 {
        if self.slots.is_empty() {
            self.rebuild(rules, 64);
        }
        let i = self.probe(&rule, rules);
        match self.slots.get(i).copied().unwrap_or(0) {
            0 => self.insert(rule, rules, i),
            n => n,
        }
    }

    #[inline(never)]
    fn insert(&mut self, rule: UnwindRule, rules: &mut Vec<UnwindRule>, slot: usize) -> u16 {
        if rules.len() >= MAX_TABLE_RULES {
            return 0;
        }
        rules.push(rule);
        // At most MAX_TABLE_RULES rules: the number fits.
        let n = rules.len() as u16;
        if let Some(s) = self.slots.get_mut(slot) {
            *s = n;
        }
        if rules.len() * 2 > self.slots.len() {
            self.rebuild(rules, self.slots.len() * 2);
        }
        n
    }

    fn rebuild(&mut self, rules: &[UnwindRule], slots: usize) {
        self.slots = vec![0; slots];
        for (k, rule) in rules.iter().enumerate() {
            let i = self.probe(rule, rules);
            if let Some(s) = self.slots.get_mut(i) {
                *s = (k + 1) as u16;
            }
        }
    }
}

impl TableBuilder {
    /// An empty builder for a table of `arch` code from `source`.
    pub fn new(arch: Arch, source: Source) -> Self {
        Self {
            table: UnwindTable::new(arch, source),
            index: RuleIndex::default(),
            over_limit: 0,
        }
    }

    /// Reserves room for this many more functions and rows.
    pub fn reserve(&mut self, functions: usize, rows: usize) {
        self.table.functions.reserve(functions);
        self.table.rows.reserve(rows);
    }

    /// Rows stored without their rule because it would have been rule number
    /// [`MAX_TABLE_RULES`] + 1 (crafted input only).
    pub fn rows_over_rule_limit(&self) -> u64 {
        self.over_limit
    }

    #[inline(always)]
    fn intern(&mut self, rule: Option<UnwindRule>) -> u16 {
        let Some(rule) = rule else {
            return 0;
        };
        let n = self.index.intern(rule, &mut self.table.rules);
        if n == 0 {
            self.over_limit += 1;
        }
        n
    }

    /// Appends a function with these rows (sorted by start offset).
    #[inline]
    pub fn push(
        &mut self,
        start: u64,
        size: u32,
        pc_type: PcType,
        rows: impl IntoIterator<Item = Row>,
    ) {
        let rows = self.push_rows(rows);
        self.table
            .functions
            .push(Function::from_parts(start, size, pc_type, rows));
    }

    /// Appends rows for a function that is not pushed yet (its rows need not follow the
    /// previous function's): returns (first row, row count) for [`Function::from_parts`].
    #[inline]
    pub(crate) fn push_rows(&mut self, rows: impl IntoIterator<Item = Row>) -> (u32, u32) {
        let rows = rows.into_iter();
        let first = self.table.rows.len();
        let table_rows = &mut self.table.rows;
        let wanted = rows.size_hint().0;
        if table_rows.capacity() - first < wanted {
            // Past the reservation: grow by an eighth, not double, so that a table a
            // little larger than estimated keeps little slack.
            table_rows.reserve_exact(wanted.max(table_rows.capacity() / 8));
        }
        for r in rows {
            let rule = self.intern(r.rule);
            self.table.rows.push(CompactRow::new(r.start_offset, rule));
        }
        Self::span(first, self.table.rows.len())
    }

    /// Appends rows as stored (rule indices of this builder).
    pub(crate) fn push_compact(
        &mut self,
        rows: impl IntoIterator<Item = CompactRow>,
    ) -> (u32, u32) {
        let first = self.table.rows.len();
        self.table.rows.extend(rows);
        Self::span(first, self.table.rows.len())
    }

    fn span(first: usize, end: usize) -> (u32, u32) {
        // A table's rows are bounded by the bytes they were read from, far below 2^32;
        // saturate rather than wrap if that ever breaks.
        (
            u32::try_from(first).unwrap_or(u32::MAX),
            u32::try_from(end - first).unwrap_or(u32::MAX),
        )
    }

    /// The rows of `f`, a function whose rows were pushed into this builder.
    pub(crate) fn rows_of(&self, f: &Function) -> &[CompactRow] {
        self.table.compact_rows(f)
    }

    /// Whether a stored row has a rule.
    pub(crate) fn has_rule(r: &CompactRow) -> bool {
        r.rule != 0
    }

    /// The table of `functions` (sorted by start, non-overlapping; their rows pushed
    /// into this builder, each row used by one function at most), from `source`. Rows
    /// no function refers to are dropped in place; the row vector keeps its capacity
    /// (trimming it would copy it).
    pub(crate) fn finish_with(
        mut self,
        source: Source,
        mut functions: Vec<Function>,
    ) -> UnwindTable {
        debug_assert!(
            functions
                .windows(2)
                .all(|w| matches!(w, [a, b] if a.end() <= b.start))
        );
        let used: u64 = functions.iter().map(|f| u64::from(f.row_count)).sum();
        if used == self.table.rows.len() as u64 {
            // Every row is used (the usual case: nothing was cut or dropped).
            self.table.source = source;
            self.table.functions = functions;
            self.table.rules.shrink_to_fit();
            return self.table;
        }
        // Move each function's rows down to the next free slot, in row order: a slot
        // is never written before its row was moved.
        let mut order: Vec<u32> = (0..functions.len() as u32).collect();
        order.sort_unstable_by_key(|&i| functions.get(i as usize).map_or(0, |f| f.first_row));
        let rows = &mut self.table.rows;
        let mut cursor = 0usize;
        for i in order {
            let Some(f) = functions.get_mut(i as usize) else {
                continue;
            };
            let first = (f.first_row as usize).min(rows.len());
            let end = first.saturating_add(f.row_count as usize).min(rows.len());
            debug_assert!(first >= cursor, "rows shared by two functions");
            let first = first.max(cursor);
            rows.copy_within(first..end.max(first), cursor);
            f.first_row = cursor as u32;
            f.row_count = (end.max(first) - first) as u32;
            cursor += f.row_count as usize;
        }
        rows.truncate(cursor);
        self.table.source = source;
        self.table.functions = functions;
        self.table.rules.shrink_to_fit();
        self.table
    }

    /// Appends `f` with its rows.
    pub fn push_function(&mut self, f: &FunctionRows) {
        self.push(f.start, f.size, f.pc_type, f.rows.iter().copied());
    }

    /// Appends function `f` of table `from`.
    pub fn push_from(&mut self, from: &UnwindTable, f: &Function) {
        self.push(f.start, f.size, f.pc_type, from.rows(f));
    }

    /// Number of functions appended so far.
    pub fn function_count(&self) -> usize {
        self.table.functions.len()
    }

    /// The table, its vectors trimmed to their length.
    pub fn finish(mut self) -> UnwindTable {
        self.table.functions.shrink_to_fit();
        self.table.rows.shrink_to_fit();
        self.table.rules.shrink_to_fit();
        self.table
    }
}

#[cfg(test)]
mod tests {
    use sframe_common::{CfaRule, RegRule, RuleFlags};

    use super::*;

    /// Row ranges agree with a lookup of every PC: the row that holds at `pc` is the last
    /// one starting at or before `(pc - start) % rep` (PCMASK) or `pc - start` (PCINC),
    /// a partial last PCMASK block included.
    #[test]
    fn row_ranges_match_a_lookup_of_every_pc() {
        for (size, pc_type, starts) in [
            (40u32, PcType::Mask { rep_size: 16 }, vec![0u32, 6]),
            (48, PcType::Mask { rep_size: 16 }, vec![0, 6, 11]),
            (7, PcType::Mask { rep_size: 16 }, vec![0, 6]),
            (30, PcType::Inc, vec![0, 1, 4, 29]),
            (30, PcType::Inc, vec![2, 40]),
            (40, PcType::Mask { rep_size: 0 }, vec![0]),
        ] {
            let (_, blocks) = pc_type.blocks(size);
            let mut owner = vec![None; size as usize];
            for (i, &s) in starts.iter().enumerate() {
                let next = starts.get(i + 1).copied();
                let ranges: Vec<_> = row_ranges(size, pc_type, s, next).collect();
                assert!(ranges.len() as u64 <= blocks);
                for (lo, hi) in ranges {
                    assert!(lo < hi && hi <= u64::from(size));
                    for pc in lo..hi {
                        assert_eq!(owner[pc as usize], None, "{size} {pc_type:?} {starts:?}");
                        owner[pc as usize] = Some(i);
                    }
                }
            }
            for pc in 0..size {
                let off = match pc_type {
                    PcType::Inc => Some(pc),
                    PcType::Mask { rep_size: 0 } => None,
                    PcType::Mask { rep_size } => Some(pc % u32::from(rep_size)),
                };
                let want = off.and_then(|o| starts.iter().rposition(|&s| s <= o));
                assert_eq!(
                    owner[pc as usize], want,
                    "pc {pc}: {size} {pc_type:?} {starts:?}"
                );
            }
        }
        assert_eq!(PcType::Mask { rep_size: 16 }.blocks(40), (16, 3));
        assert_eq!(PcType::Inc.blocks(40), (40, 1));
    }

    fn rule(cfa: i32) -> Option<UnwindRule> {
        Some(UnwindRule {
            cfa: CfaRule::sp(cfa),
            ra: RegRule::AtCfa(-8),
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        })
    }

    fn f(start: u64, rows: &[(u32, Option<UnwindRule>)]) -> FunctionRows {
        FunctionRows {
            start,
            size: 16,
            pc_type: PcType::Inc,
            rows: rows
                .iter()
                .map(|&(start_offset, rule)| Row { start_offset, rule })
                .collect(),
        }
    }

    #[test]
    fn rules_are_stored_once_and_rows_read_back() {
        let fns = vec![
            f(
                0x1000,
                &[(0, rule(8)), (1, rule(16)), (4, None), (8, rule(8))],
            ),
            f(0x1010, &[(0, rule(16)), (2, rule(8))]),
        ];
        let t = UnwindTable::from_functions(Arch::Amd64, Source::Synthesized, fns.clone());
        assert_eq!(t.rules().len(), 2);
        assert_eq!(t.row_count(), 6);
        assert_eq!(t.to_function_rows(), fns);
        let g = &t.functions()[0];
        assert_eq!(t.rows(g).len(), 4);
        assert_eq!(
            t.rows(g).get(2),
            Some(Row {
                start_offset: 4,
                rule: None
            })
        );
        assert_eq!(t.rows(g).next_back().map(|r| r.start_offset), Some(8));
        assert!(t.heap_bytes() >= 6 * 8 + 2 * size_of::<Function>());
    }

    #[test]
    fn rows_are_six_bytes_and_rules_past_the_limit_are_counted() {
        assert_eq!(size_of::<CompactRow>(), 6);
        let mut b = TableBuilder::new(Arch::Amd64, Source::Synthesized);
        // Every rule twice (the second time found through the index, after its
        // rebuilds), then one past the limit, stored without a rule and counted. Start
        // offsets above 16 bits check both halves.
        let n = MAX_TABLE_RULES;
        let want = |i: usize| {
            if i < 2 * n {
                rule((i % n) as i32)
            } else {
                None
            }
        };
        let start = |i: usize| 0xfff0 + 3 * i as u32;
        let rows = (0..=2 * n).map(|i| Row {
            start_offset: start(i),
            rule: if i < 2 * n { want(i) } else { rule(n as i32) },
        });
        let span = b.push_rows(rows);
        assert_eq!(b.rows_over_rule_limit(), 1);
        let t = b.finish_with(
            Source::Synthesized,
            vec![Function::from_parts(0, u32::MAX, PcType::Inc, span)],
        );
        assert_eq!(t.rules().len(), MAX_TABLE_RULES);
        let got: Vec<Row> = t.rows(&t.functions()[0]).collect();
        assert_eq!(got.len(), 2 * n + 1);
        for (i, r) in got.iter().enumerate() {
            assert_eq!((r.start_offset, r.rule), (start(i), want(i)), "row {i}");
        }
    }

    #[test]
    fn equality_ignores_rule_numbering_and_merge_keeps_order() {
        let a = UnwindTable::from_functions(
            Arch::Amd64,
            Source::EhFrame,
            [f(0x1000, &[(0, rule(8)), (1, rule(16))])],
        );
        let b = UnwindTable::from_functions(
            Arch::Amd64,
            Source::EhFrame,
            [f(0x2000, &[(0, rule(16))]), f(0x3000, &[(0, rule(24))])],
        );
        let m = a.merged_with(&b, |g| g.start != 0x3000);
        let starts: Vec<u64> = m.functions().iter().map(|g| g.start).collect();
        assert_eq!(starts, vec![0x1000, 0x2000]);
        // Same rows, rules interned in another order.
        let c = UnwindTable::from_functions(
            Arch::Amd64,
            Source::EhFrame,
            [
                f(0x1000, &[(0, rule(8)), (1, rule(16))]),
                f(0x2000, &[(0, rule(16))]),
            ],
        );
        assert_eq!(m, c);
        let d = b.merged_with(&a, |_| true);
        let starts: Vec<u64> = d.functions().iter().map(|g| g.start).collect();
        assert_eq!(starts, vec![0x1000, 0x2000, 0x3000]);
        assert_ne!(d, c);
        let mut e = m.clone();
        e.retain(|g| g.start == 0x2000);
        assert_eq!(e.to_function_rows(), vec![f(0x2000, &[(0, rule(16))])]);
    }
}
