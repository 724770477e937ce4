//! DWARF CFI → rows: enumerates the FDEs of one `.eh_frame` / `.debug_frame` section,
//! evaluates each FDE's program with gimli and normalizes every row to an
//! [`UnwindRule`] (or `None` where no rule expresses it).

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CommonInformationEntry, DebugFrame, EhFrame, EhFrameHdr, EhFrameOffset,
    EndianSlice, FrameDescriptionEntry, Register, RunTimeEndian, UnwindContext, UnwindSection,
    UnwindTableRow,
};
use sframe_common::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};

use super::error::{CfiSection, EhFrameError, FdeError, SkipReason, Warning};
use super::expr::{self, ExprBase};
use super::stats::DeriveStats;
use crate::table::{Arch, Function, PcType, Row, TableBuilder};

type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// DWARF register numbers that matter to the normalized rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArchRegs {
    pub arch: Arch,
    pub sp: u16,
    pub fp: u16,
    /// The RA rule when the CFI leaves the RA column unspecified: on AMD64 the RA is
    /// always at CFA-8; on AArch64 it is still in the link register.
    pub default_ra: RegRule,
}

impl ArchRegs {
    pub(crate) fn for_arch(arch: Arch) -> Option<Self> {
        match arch {
            Arch::Amd64 => Some(Self {
                arch,
                sp: arch.dwarf_regs().sp,
                fp: arch.dwarf_regs().fp,
                default_ra: RegRule::AtCfa(-8),
            }),
            Arch::Aarch64 { .. } => Some(Self {
                arch,
                sp: arch.dwarf_regs().sp,
                fp: arch.dwarf_regs().fp,
                default_ra: RegRule::Unchanged,
            }),
            Arch::S390x => None,
        }
    }

    fn base(&self, reg: u16) -> CfaBase {
        if reg == self.sp {
            CfaBase::Sp
        } else if reg == self.fp {
            CfaBase::Fp
        } else {
            CfaBase::Reg(reg)
        }
    }

    fn vendor(&self) -> gimli::Vendor {
        match self.arch {
            Arch::Aarch64 { .. } => gimli::Vendor::AArch64,
            _ => gimli::Vendor::Default,
        }
    }
}

/// One section's bytes and the address they are loaded at.
#[derive(Clone, Copy, Debug)]
pub struct SectionData<'a> {
    /// The section's bytes.
    pub data: &'a [u8],
    /// Virtual address of the section's first byte.
    pub address: u64,
}

/// What the evaluator needs to know about the object.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Env {
    pub regs: ArchRegs,
    pub endian: RunTimeEndian,
    pub address_size: u8,
    pub text: Option<u64>,
    pub got: Option<u64>,
    /// Room to keep in each section's candidate list for functions added after the
    /// conversion (synthesized PLT rows), so that adding them does not reallocate it.
    pub extra_functions: usize,
}

impl Env {
    fn bases(&self, section: CfiSection, s: &SectionData<'_>, hdr: Option<u64>) -> BaseAddresses {
        let mut b = BaseAddresses::default();
        if section == CfiSection::EhFrame {
            b = b.set_eh_frame(s.address);
        }
        if let Some(h) = hdr {
            b = b.set_eh_frame_hdr(h);
        }
        if let Some(t) = self.text {
            b = b.set_text(t);
        }
        if let Some(g) = self.got {
            b = b.set_got(g);
        }
        b
    }
}

/// Converts `.eh_frame`, enumerating its FDEs through `.eh_frame_hdr`'s table when
/// `hdr` is given and usable, else by walking the section.
pub(crate) fn convert_eh_frame(
    eh: &SectionData<'_>,
    hdr: Option<&SectionData<'_>>,
    env: &Env,
    stats: &mut DeriveStats,
    builder: &mut TableBuilder,
) -> Result<Vec<Candidate>, EhFrameError> {
    let Prescan {
        fdes,
        patched,
        key_b_cies,
    } = prescan(eh.data, env.endian, CfiSection::EhFrame)?;
    let data = patched.as_deref().unwrap_or(eh.data);
    let mut section = EhFrame::new(data, env.endian);
    section.set_address_size(env.address_size);
    section.set_vendor(env.regs.vendor());
    let bases = env.bases(CfiSection::EhFrame, eh, hdr.map(|h| h.address));
    let mut conv = Converter::new(
        CfiSection::EhFrame,
        env,
        data.len(),
        fdes,
        key_b_cies,
        builder,
    );

    // The header's table is what the runtime unwinder searches, so its FDEs come first;
    // the walk then adds any FDE the table does not list (and everything when there is
    // no usable table).
    let mut listed = Vec::new();
    if let Some(hdr) = hdr {
        match hdr_fde_offsets(hdr, eh, env, &bases, fdes) {
            Ok(offsets) => {
                stats.used_eh_frame_hdr = !offsets.is_empty();
                for (index, &offset) in offsets.iter().enumerate() {
                    stats.fdes_seen += 1;
                    let offset = offset as usize;
                    let partial = section.partial_fde_from_offset(&bases, EhFrameOffset(offset));
                    let result = partial
                        .map_err(|e| (SkipReason::from_gimli(e), Some(e)))
                        .and_then(|p| conv.convert(&section, &bases, &p, index));
                    conv.record(result, index, offset as u64, stats);
                    if conv.budget_exhausted() {
                        return Ok(conv.functions);
                    }
                }
                listed = offsets;
            }
            Err(source) => stats.warnings.push(Warning::HdrUnusable { source }),
        }
    }
    conv.walk(&section, data, &bases, &listed, stats);
    Ok(conv.functions)
}

/// Converts `.debug_frame` (of the object or of its separate debug file).
pub(crate) fn convert_debug_frame(
    df: &SectionData<'_>,
    kind: CfiSection,
    env: &Env,
    stats: &mut DeriveStats,
    builder: &mut TableBuilder,
) -> Result<Vec<Candidate>, EhFrameError> {
    let Prescan {
        fdes,
        patched,
        key_b_cies,
    } = prescan(df.data, env.endian, kind)?;
    let data = patched.as_deref().unwrap_or(df.data);
    let mut section = DebugFrame::new(data, env.endian);
    section.set_address_size(env.address_size);
    section.set_vendor(env.regs.vendor());
    let bases = env.bases(kind, df, None);
    let mut conv = Converter::new(kind, env, data.len(), fdes, key_b_cies, builder);
    conv.walk(&section, data, &bases, &[], stats);
    Ok(conv.functions)
}

/// CIE augmentation characters that are flags without augmentation data and do not
/// change the rows, which gimli rejects as unknown: AArch64 `B` (return addresses signed
/// with the B key; the signature is stripped the same way) and `G` (MTE-tagged frames).
const FLAG_AUGMENTATIONS: &[u8] = b"BG";

/// For one CIE entry (length field included): where the augmentation string starts,
/// what replaces it up to the end of the code alignment factor, and whether `B` was
/// among the flags dropped, when it has flags to drop.
fn patch_cie(entry: &[u8], is_eh: bool) -> Option<(usize, Vec<u8>, bool)> {
    // Length (4, or 4 + 8 for 64-bit DWARF), CIE id (4, or 8 in a 64-bit
    // `.debug_frame`), version.
    let wide = entry.get(..4)? == [0xff; 4];
    let version_at = match (wide, is_eh) {
        (false, _) => 8,
        (true, true) => 16,
        (true, false) => 20,
    };
    let version = *entry.get(version_at)?;
    if version != 1 && version != 3 {
        return None;
    }
    let aug_at = version_at + 1;
    let nul = aug_at + entry.get(aug_at..)?.iter().position(|&b| b == 0)?;
    let aug = entry.get(aug_at..nul)?;
    let dropped = aug
        .iter()
        .filter(|c| FLAG_AUGMENTATIONS.contains(c))
        .count();
    if dropped == 0 {
        return None;
    }
    // The code alignment factor: a ULEB128 of at most 10 bytes.
    let caf_at = nul + 1;
    let caf_len = entry
        .get(caf_at..)?
        .iter()
        .take(10)
        .position(|&b| b & 0x80 == 0)?
        + 1;
    let mut fixed: Vec<u8> = aug
        .iter()
        .copied()
        .filter(|c| !FLAG_AUGMENTATIONS.contains(c))
        .collect();
    fixed.push(0);
    let (&last, head) = entry.get(caf_at..caf_at + caf_len)?.split_last()?;
    fixed.extend_from_slice(head);
    // The last byte goes on with a continuation bit; zero-valued groups follow.
    fixed.push(last | 0x80);
    fixed.extend(std::iter::repeat_n(0x80, dropped - 1));
    fixed.push(0);
    debug_assert_eq!(fixed.len(), caf_at + caf_len - aug_at);
    Some((aug_at, fixed, aug.contains(&b'B')))
}

/// Most FDEs one CFI section may have (as many as an SFrame section may have
/// functions). Sections with more are refused before any FDE is evaluated.
pub const MAX_FDES: u64 = crate::sframe::MAX_FUNCTIONS as u64;

/// What [`prescan`] found.
struct Prescan {
    fdes: usize,
    /// The section without the flag augmentations, when a CIE had some.
    patched: Option<Vec<u8>>,
    /// Offsets of the CIEs whose augmentation had `B` (AArch64 return addresses
    /// signed with the B key), in order.
    key_b_cies: Vec<u32>,
}

/// One walk over the entry headers before any FDE is evaluated (a few nanoseconds an
/// entry): counts the FDEs, refusing a section with more than [`MAX_FDES`], and, when a
/// CIE's augmentation string has [`FLAG_AUGMENTATIONS`], returns a copy of the section
/// without them (and which CIEs had `B`). The copy keeps every length and offset: the
/// string gets shorter by k bytes and the code alignment factor after it (a ULEB128,
/// in CIE versions 1 and 3) longer by k redundant bytes with the same value.
fn prescan(
    data: &[u8],
    endian: RunTimeEndian,
    section: CfiSection,
) -> Result<Prescan, EhFrameError> {
    let is_eh = section == CfiSection::EhFrame;
    let mut fdes = 0u64;
    let mut patched: Option<Vec<u8>> = None;
    let mut key_b_cies = Vec::new();
    let mut offset = 0usize;
    while offset < data.len() {
        // A bad header ends the walk; the conversion reports it.
        let Ok(Some(header)) = entry_header(data, offset, endian, is_eh) else {
            break;
        };
        if !header.is_cie {
            fdes += 1;
            if fdes > MAX_FDES {
                return Err(EhFrameError::LimitExceeded {
                    section,
                    what: "FDEs",
                    limit: MAX_FDES,
                });
            }
        } else if let Some(entry) = data.get(offset..header.end)
            && let Some((at, fixed, key_b)) = patch_cie(entry, is_eh)
        {
            let copy = patched.get_or_insert_with(|| data.to_vec());
            // Inside `entry`, a part of `data`: the range is in the copy.
            if let Some(dst) = copy.get_mut(offset + at..offset + at + fixed.len()) {
                dst.copy_from_slice(&fixed);
            }
            if key_b && let Ok(o) = u32::try_from(offset) {
                key_b_cies.push(o);
            }
        }
        offset = header.end;
    }
    Ok(Prescan {
        fdes: fdes as usize,
        patched,
        key_b_cies,
    })
}

/// The `.eh_frame` offsets of the FDEs listed in `.eh_frame_hdr`, sorted, deduplicated
/// (4 bytes each: they are held while the whole section converts).
fn hdr_fde_offsets(
    hdr: &SectionData<'_>,
    eh: &SectionData<'_>,
    env: &Env,
    bases: &BaseAddresses,
    fdes: usize,
) -> Result<Vec<u32>, gimli::Error> {
    let parsed = EhFrameHdr::new(hdr.data, env.endian).parse(bases, env.address_size)?;
    let eh_ptr = parsed.eh_frame_ptr().direct()?;
    if eh_ptr != eh.address {
        return Err(gimli::Error::OffsetOutOfBounds);
    }
    let Some(table) = parsed.table() else {
        return Ok(Vec::new());
    };
    // Each entry takes at least 2 bytes: never trust fde_count for the allocation.
    let cap = hdr.data.len() / 2;
    let mut offsets = Vec::with_capacity(fdes.min(cap));
    let mut iter = table.iter(bases);
    while let Some((_, fde_ptr)) = iter.next()? {
        if offsets.len() >= cap {
            break;
        }
        // gimli's pointer_to_offset subtracts unchecked; do it checked.
        let off = fde_ptr
            .direct()?
            .checked_sub(eh_ptr)
            .and_then(|o| u32::try_from(o).ok())
            .filter(|&o| (o as usize) < eh.data.len())
            .ok_or(gimli::Error::OffsetOutOfBounds)?;
        offsets.push(off);
    }
    offsets.sort_unstable();
    offsets.dedup();
    Ok(offsets)
}

type Skip = (SkipReason, Option<gimli::Error>);

/// Where a converted function came from, to report it if it is later dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    pub section: CfiSection,
    pub index: u32,
    pub offset: u32,
}

/// Functions start and end below this address (48 bits: no user-space code of x86-64
/// or AArch64 lives above); FDEs beyond it are skipped as [`SkipReason::TooLarge`].
pub(crate) const ADDRESS_LIMIT: u64 = 1 << 48;
/// Bits of a candidate's row index, row count and FDE index (the FDE index saturates).
const ROW_BITS: u32 = 26;
const COUNT_BITS: u32 = 24;
const INDEX_BITS: u32 = 22;

/// A converted FDE: its function (rows in the deriver's [`TableBuilder`]) and where it
/// came from (FDE index and offset; the section is the list's), packed into 24 bytes,
/// the size of a [`Function`]: the deriver holds one per FDE until the table is done,
/// and the list then becomes the table's function list in place, without a copy.
/// Layout: start (48 bits) with the FDE index's low 16 bits above it; size; first row
/// (26 bits) with the index's high 6 bits; row count (24 bits) with the PCMASK
/// `rep_size` above it (0: PCINC); the FDE offset.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    start_index: u64,
    size: u32,
    row_index: u32,
    count_rep: u32,
    offset: u32,
}

const _: () = assert!(size_of::<Candidate>() == size_of::<Function>());

impl Candidate {
    /// `None` when the function does not fit the packing: it ends above
    /// [`ADDRESS_LIMIT`], its first row is at 2^26 or beyond, or it has 2^24 rows or more
    /// (only crafted input gets there).
    pub fn new(f: &Function, index: u32, offset: u32) -> Option<Self> {
        let (first_row, row_count) = f.row_span();
        if f.end() > ADDRESS_LIMIT || first_row >> ROW_BITS != 0 || row_count >> COUNT_BITS != 0 {
            return None;
        }
        let index = index.min((1 << INDEX_BITS) - 1);
        let rep = match f.pc_type {
            PcType::Inc => 0,
            PcType::Mask { rep_size } => u32::from(rep_size.max(1)),
        };
        Some(Self {
            start_index: f.start | u64::from(index & 0xffff) << 48,
            size: f.size,
            row_index: first_row | (index >> 16) << ROW_BITS,
            count_rep: row_count | rep << COUNT_BITS,
            offset,
        })
    }
    pub fn function(&self) -> Function {
        let rep = (self.count_rep >> COUNT_BITS) as u8;
        let pc_type = if rep == 0 {
            PcType::Inc
        } else {
            PcType::Mask { rep_size: rep }
        };
        Function::from_parts(
            self.start(),
            self.size,
            pc_type,
            (
                self.row_index & ((1 << ROW_BITS) - 1),
                self.count_rep & ((1 << COUNT_BITS) - 1),
            ),
        )
    }
    /// A part of this candidate's function (or its rows pushed anew): same origin.
    pub fn with_function(&self, f: &Function) -> Option<Self> {
        Self::new(f, self.index(), self.offset)
    }
    /// FDE index in its section's enumeration order (saturated at 2^22 − 1).
    pub fn index(&self) -> u32 {
        (self.start_index >> 48) as u32 | (self.row_index >> ROW_BITS) << 16
    }
    /// Where it came from, `section` being its list's.
    pub fn origin(&self, section: CfiSection) -> Origin {
        Origin {
            section,
            index: self.index(),
            offset: self.offset,
        }
    }
    pub fn start(&self) -> u64 {
        self.start_index & (ADDRESS_LIMIT - 1)
    }
    pub fn end(&self) -> u64 {
        self.start().saturating_add(u64::from(self.size))
    }
}

/// Evaluates FDEs of one section into functions.
struct Converter<'e, 'b> {
    kind: CfiSection,
    env: Env,
    ctx: UnwindContext<usize>,
    cies: HashMap<usize, Result<CommonInformationEntry<R<'e>>, gimli::Error>>,
    /// Rows left for this section: every row needs at least one byte of CFI, so a
    /// well-formed section never exceeds its size; this bounds memory on crafted input
    /// (e.g. a `.eh_frame_hdr` pointing many times into overlapping FDE bytes).
    budget: usize,
    functions: Vec<Candidate>,
    /// Where the rows go, each distinct rule once.
    builder: &'b mut TableBuilder,
    /// The rows of the FDE being converted.
    scratch: Vec<Row>,
    /// CIEs whose FDEs sign return addresses with the B key ([`Prescan`]).
    key_b_cies: Vec<u32>,
}

/// Bytes of CFI per row in real objects are 5.9 to 6.7 (libc, libstdc++, python3,
/// libLLVM): room for the rows is reserved from the section size (2 rows per 11 bytes),
/// so that their vector seldom grows (a growth copies it) and keeps little slack.
const fn rows_for_cfi_bytes(len: usize) -> usize {
    len / 11 * 2
}

impl<'e, 'b> Converter<'e, 'b> {
    /// For a section of `section_len` bytes and `fdes` FDEs, whose CIEs at the offsets
    /// `key_b_cies` had the `B` augmentation.
    fn new(
        kind: CfiSection,
        env: &Env,
        section_len: usize,
        fdes: usize,
        key_b_cies: Vec<u32>,
        builder: &'b mut TableBuilder,
    ) -> Self {
        let budget = section_len
            .saturating_add(64)
            .min(crate::sframe::MAX_SECTION_ROWS as usize);
        builder.reserve(0, rows_for_cfi_bytes(section_len));
        Self {
            kind,
            env: *env,
            ctx: UnwindContext::new(),
            cies: HashMap::new(),
            budget,
            functions: Vec::with_capacity(fdes.saturating_add(env.extra_functions)),
            builder,
            scratch: Vec::new(),
            key_b_cies,
        }
    }

    fn budget_exhausted(&self) -> bool {
        self.budget == 0
    }

    fn record(
        &mut self,
        result: Result<Function, Skip>,
        index: usize,
        offset: u64,
        stats: &mut DeriveStats,
    ) {
        let index32 = u32::try_from(index).unwrap_or(u32::MAX);
        let offset32 = u32::try_from(offset).unwrap_or(u32::MAX);
        // Addresses were checked in `convert_fde`: only a row array past 2^26 makes a
        // function that does not fit a candidate.
        let candidate = result.and_then(|f| {
            Candidate::new(&f, index32, offset32).ok_or((SkipReason::RowBudget, None))
        });
        match candidate {
            Ok(c) => {
                stats.fdes_converted += 1;
                if self.kind != CfiSection::EhFrame {
                    stats.fdes_from_debug_frame += 1;
                }
                self.functions.push(c);
            }
            Err((reason, source)) => stats.skip(FdeError {
                section: self.kind,
                index,
                offset,
                reason,
                source,
            }),
        }
    }

    /// Walks all entries of the section in order (skipping FDEs at the sorted offsets
    /// `already`, converted from `.eh_frame_hdr`), reading only the entry headers itself
    /// so that a bad CIE or FDE body skips that entry alone. A length that runs past the
    /// section ends the walk (the next entry cannot be found); FDEs before it are kept.
    fn walk<S>(
        &mut self,
        section: &S,
        data: &'e [u8],
        bases: &BaseAddresses,
        already: &[u32],
        stats: &mut DeriveStats,
    ) where
        S: UnwindSection<R<'e>>,
        S::Offset: gimli::UnwindOffset<usize>,
    {
        let is_eh = self.kind == CfiSection::EhFrame;
        let mut index = already.len();
        let mut offset = 0usize;
        while offset < data.len() {
            let header = match entry_header(data, offset, self.env.endian, is_eh) {
                Ok(Some(h)) => h,
                // The zero terminator of `.eh_frame`.
                Ok(None) => break,
                Err(e) => {
                    stats.skip(FdeError {
                        section: self.kind,
                        index,
                        offset: offset as u64,
                        reason: SkipReason::Truncated,
                        source: Some(e),
                    });
                    break;
                }
            };
            let listed = u32::try_from(offset).is_ok_and(|o| already.binary_search(&o).is_ok());
            if !header.is_cie && !listed {
                stats.fdes_seen += 1;
                let result = section
                    .partial_fde_from_offset(bases, S::Offset::from(offset))
                    .map_err(|e| (SkipReason::from_gimli(e), Some(e)))
                    .and_then(|partial| self.convert(section, bases, &partial, index));
                self.record(result, index, offset as u64, stats);
                index += 1;
                if self.budget_exhausted() {
                    break;
                }
            }
            offset = header.end;
        }
    }

    fn convert<S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        partial: &gimli::PartialFrameDescriptionEntry<'_, S, R<'e>>,
        _index: usize,
    ) -> Result<Function, Skip>
    where
        S: UnwindSection<R<'e>>,
        S::Offset: gimli::UnwindOffset<usize>,
    {
        let mut cie_error = None;
        let cies = &mut self.cies;
        let fde = partial
            .parse(|s, b, off| {
                let key = gimli::UnwindOffset::into(off);
                let r = cies
                    .entry(key)
                    .or_insert_with(|| s.cie_from_offset(b, off))
                    .clone();
                if let Err(e) = &r {
                    cie_error = Some(*e);
                }
                r
            })
            .map_err(|e| match cie_error {
                Some(ce) if ce == gimli::Error::UnknownAugmentation => {
                    (SkipReason::UnknownAugmentation, Some(ce))
                }
                Some(ce) => (SkipReason::BadCie, Some(ce)),
                None => (
                    match SkipReason::from_gimli(e) {
                        SkipReason::BadCie | SkipReason::BadInstructions => SkipReason::BadFde,
                        r => r,
                    },
                    Some(e),
                ),
            })?;
        self.convert_fde(section, bases, &fde)
    }

    fn convert_fde<S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        fde: &FrameDescriptionEntry<R<'e>>,
    ) -> Result<Function, Skip>
    where
        S: UnwindSection<R<'e>>,
    {
        let start = fde.initial_address();
        let len = fde.len();
        if len == 0 {
            return Err((SkipReason::Empty, None));
        }
        let size = u32::try_from(len).map_err(|_| (SkipReason::TooLarge, None))?;
        let end = start
            .checked_add(len)
            .filter(|&e| self.env.address_size >= 8 || e <= u64::from(u32::MAX) + 1)
            .filter(|&e| e <= ADDRESS_LIMIT)
            .ok_or((SkipReason::TooLarge, None))?;

        let ra_col = fde.cie().return_address_register();
        let ra_undefined = explicit_undefined(section, bases, fde, ra_col)
            .map_err(|e| (SkipReason::from_gimli(e), Some(e)))?;
        let mut base_flags = RuleFlags::default();
        if fde.is_signal_trampoline() {
            base_flags = base_flags.with(RuleFlags::SIGNAL);
        }
        let key_b = u32::try_from(fde.cie().offset())
            .is_ok_and(|o| self.key_b_cies.binary_search(&o).is_ok());
        let eval = RowEval {
            regs: self.env.regs,
            ra_col,
            ra_undefined,
            base_flags,
            key_b,
        };

        let mut rows = std::mem::take(&mut self.scratch);
        rows.clear();
        let result = self.fde_rows(section, bases, fde, &eval, start, end, &mut rows);
        let function = result.and_then(|()| {
            if rows.is_empty() {
                return Err((SkipReason::Empty, None));
            }
            let span = self.builder.push_rows(rows.iter().copied());
            Ok(Function::from_parts(start, size, PcType::Inc, span))
        });
        self.scratch = rows;
        function
    }

    /// Evaluates the FDE's rows into `rows` (adjacent identical rows merged).
    #[allow(clippy::too_many_arguments, reason = "one call site, all borrowed")]
    fn fde_rows<S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        fde: &FrameDescriptionEntry<R<'e>>,
        eval: &RowEval,
        start: u64,
        end: u64,
        rows: &mut Vec<Row>,
    ) -> Result<(), Skip>
    where
        S: UnwindSection<R<'e>>,
    {
        let mut table = fde
            .rows(section, bases, &mut self.ctx)
            .map_err(|e| (SkipReason::from_gimli(e), Some(e)))?;
        loop {
            let row = match table.next_row() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) => return Err((SkipReason::from_gimli(e), Some(e))),
            };
            let (rs, re) = (row.start_address(), row.end_address());
            if rs >= end {
                break;
            }
            if re <= rs {
                // Zero-length row (an advance by 0): the next row replaces it.
                continue;
            }
            if self.budget == 0 {
                return Err((SkipReason::RowBudget, None));
            }
            self.budget -= 1;
            // rs is in [start, end) and end - start fits u32.
            let offset = u32::try_from(rs - start).map_err(|_| (SkipReason::TooLarge, None))?;
            push_row(
                rows,
                Row {
                    start_offset: offset,
                    rule: eval.rule(section, row),
                },
            );
        }
        Ok(())
    }
}

struct EntryHeader {
    is_cie: bool,
    /// Offset of the next entry.
    end: usize,
}

/// Reads the length and CIE id/pointer of the entry at `offset`; `None` at the
/// `.eh_frame` zero terminator.
fn entry_header(
    data: &[u8],
    offset: usize,
    endian: RunTimeEndian,
    is_eh: bool,
) -> Result<Option<EntryHeader>, gimli::Error> {
    use gimli::Reader;
    let mut r = EndianSlice::new(data.get(offset..).unwrap_or(&[]), endian);
    let len32 = r.read_u32()?;
    let (len, id_size) = match len32 {
        0 if is_eh => return Ok(None),
        0xffff_ffff => (r.read_u64()?, 8usize),
        0xffff_fff0..=0xffff_fffe => return Err(gimli::Error::UnknownReservedLength),
        l => (u64::from(l), 4),
    };
    let header = if id_size == 8 { 12 } else { 4 };
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| offset.checked_add(header)?.checked_add(l))
        .filter(|&e| e <= data.len())
        .ok_or(gimli::Error::UnexpectedEof(gimli::ReaderOffsetId(
            offset as u64,
        )))?;
    if len == 0 {
        // An empty entry (only seen in `.debug_frame` padding): skip it.
        return Ok(Some(EntryHeader { is_cie: true, end }));
    }
    // `.eh_frame`'s CIE id / pointer is 4 bytes even in the 64-bit format.
    let id = if id_size == 8 && !is_eh {
        r.read_u64()?
    } else {
        u64::from(r.read_u32()?)
    };
    let is_cie = if is_eh {
        id == 0
    } else {
        id == 0xffff_ffff || id == u64::MAX
    };
    Ok(Some(EntryHeader { is_cie, end }))
}

/// Appends a row, merging it into the previous one when the rule is the same.
pub(crate) fn push_row(rows: &mut Vec<Row>, row: Row) {
    if let Some(last) = rows.last_mut() {
        if last.start_offset == row.start_offset {
            last.rule = row.rule;
            // The replaced row may now equal its predecessor.
            if let [.., a, b] = rows.as_slice()
                && a.rule == b.rule
            {
                rows.pop();
            }
            return;
        }
        if last.rule == row.rule {
            return;
        }
    }
    rows.push(row);
}

/// True when the CIE or FDE program says `DW_CFA_undefined` for the RA column. gimli
/// stores "undefined" and "never specified" alike; they differ for the RA (outermost
/// frame vs. the architecture's default location).
fn explicit_undefined<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    fde: &FrameDescriptionEntry<R<'a>>,
    ra_col: Register,
) -> Result<bool, gimli::Error>
where
    S: UnwindSection<R<'a>>,
{
    let mut cie_insns = fde.cie().instructions(section, bases);
    while let Some(insn) = cie_insns.next()? {
        if matches!(insn, gimli::CallFrameInstruction::Undefined { register } if register == ra_col)
        {
            return Ok(true);
        }
    }
    let mut insns = fde.instructions(section, bases);
    while let Some(insn) = insns.next()? {
        if matches!(insn, gimli::CallFrameInstruction::Undefined { register } if register == ra_col)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Per-FDE constants for normalizing rows.
struct RowEval {
    regs: ArchRegs,
    ra_col: Register,
    ra_undefined: bool,
    base_flags: RuleFlags,
    /// The CIE had the `B` augmentation: signed return addresses use the B key.
    key_b: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Ra,
    Fp,
}

impl RowEval {
    fn rule<'a, S: UnwindSection<R<'a>>>(
        &self,
        section: &S,
        row: &UnwindTableRow<usize>,
    ) -> Option<UnwindRule> {
        let cfa = match row.cfa() {
            gimli::CfaRule::RegisterAndOffset { register, offset } => CfaRule {
                base: self.regs.base(register.0),
                offset: i32::try_from(*offset).ok()?,
                deref: false,
            },
            gimli::CfaRule::Expression(e) => {
                let x = expr::parse(e.get(section).ok()?.0.slice())?;
                match x.base {
                    ExprBase::Reg(r) => CfaRule {
                        base: self.regs.base(r),
                        offset: i32::try_from(x.offset).ok()?,
                        deref: x.deref,
                    },
                    ExprBase::Cfa => return None,
                }
            }
        };
        let ra = self.reg_rule(section, row.register(self.ra_col), self.ra_col, Role::Ra)?;
        let fp_reg = Register(self.regs.fp);
        let fp = self.reg_rule(section, row.register(fp_reg), fp_reg, Role::Fp)?;
        let mut flags = self.base_flags;
        if matches!(self.regs.arch, Arch::Aarch64 { .. })
            && matches!(row.register(gimli::AArch64::RA_SIGN_STATE), gimli::RegisterRule::Constant(v) if v & 1 == 1)
        {
            flags = flags.with(RuleFlags::MANGLED_RA);
            if self.key_b {
                flags = flags.with(RuleFlags::PAUTH_KEY_B);
            }
        }
        Some(UnwindRule { cfa, ra, fp, flags })
    }

    fn reg_rule<'a, S: UnwindSection<R<'a>>>(
        &self,
        section: &S,
        rule: gimli::RegisterRule<usize>,
        own: Register,
        role: Role,
    ) -> Option<RegRule> {
        use gimli::RegisterRule as G;
        Some(match rule {
            G::Undefined => match role {
                // "Same value" and "unspecified" are alike for the FP.
                Role::Fp => RegRule::Unchanged,
                Role::Ra if self.ra_undefined => RegRule::Undefined,
                Role::Ra => self.regs.default_ra,
            },
            G::SameValue => RegRule::Unchanged,
            G::Offset(o) => RegRule::AtCfa(i32::try_from(o).ok()?),
            G::ValOffset(o) => RegRule::ValCfa(i32::try_from(o).ok()?),
            G::Register(r) if r == own => RegRule::Unchanged,
            G::Register(r) => RegRule::InReg(r.0),
            G::Expression(e) => {
                let x = expr::parse(e.get(section).ok()?.0.slice())?;
                let offset = i32::try_from(x.offset).ok()?;
                match (x.base, x.deref) {
                    (_, true) => return None,
                    (ExprBase::Cfa, false) => RegRule::AtCfa(offset),
                    (ExprBase::Reg(reg), false) => RegRule::AtReg { reg, offset },
                }
            }
            G::ValExpression(e) => {
                let x = expr::parse(e.get(section).ok()?.0.slice())?;
                match (x.base, x.deref, x.offset) {
                    (ExprBase::Cfa, false, o) => RegRule::ValCfa(i32::try_from(o).ok()?),
                    (ExprBase::Reg(r), false, 0) if r == own.0 => RegRule::Unchanged,
                    (ExprBase::Reg(r), false, 0) => RegRule::InReg(r),
                    _ => return None,
                }
            }
            _ => return None,
        })
    }
}
