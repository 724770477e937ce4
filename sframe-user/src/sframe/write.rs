//! Writer: an [`UnwindTable`] to SFrame version 2 (with `SFRAME_F_FDE_FUNC_START_PCREL`)
//! or version 3 bytes, for a given section virtual address. Flags are always
//! `SFRAME_F_FDE_SORTED | SFRAME_F_FDE_FUNC_START_PCREL`; functions are emitted in
//! address order. AMD64 uses the fixed RA offset -8 in the header (as GNU as does), so
//! AMD64 rows must have RA = *(CFA-8) (or undefined).
//!
//! What the writer does with rows it cannot store as they are:
//! - `rule: None` rows (an explicit "no rule" range) in PCINC functions split the
//!   function: the FDE ends where the `None` row starts and a new FDE starts at the next
//!   row that has a rule, so lookups in the range find nothing. Each such row is counted
//!   in [`WriteStats::none_rows`]. In PCMASK functions they are an error (a block pattern
//!   cannot be split).
//! - v3 functions with more than 65535 rows are split the same way (the v3 FRE count
//!   field is 16 bits); [`WriteStats::splits`] counts the extra FDEs.
//! - Rows the default encoding cannot express (CFA from another register or
//!   dereferenced, RA/FP in registers, ...) make v3 use the FLEX FDE type for that
//!   function; in v2 they are a [`WriteError::Unrepresentable`] error, as are rules no
//!   encoding expresses (`ValCfa`, undefined FP, `reg + offset` without dereference).
//! - RA-undefined rows are stored as zero-data-word FREs: only the CFA base register
//!   bit (so the base must be SP or FP) and the mangled-RA bit are kept (the CFA offset and FP rule are not stored;
//!   they read back as offset 0 and FP unchanged).
//! - `PAUTH_KEY_B` is stored per function and only read back on rows with
//!   `MANGLED_RA`; `SIGNAL` is stored per function (v3 only).
//!
//! Reading the output back gives the same functions and rows, except for the splits
//! above.

use sframe_common::{CfaBase, RegRule, RuleFlags, UnwindRule};

use super::error::WriteError;
use super::header::{
    Abi, Endian, F_FDE_FUNC_START_PCREL, F_FDE_SORTED, FDE_SIZE_V2, FDE_SIZE_V3, HEADER_SIZE,
    MAGIC, S390X_CFA_OFFSET_ADJUSTMENT, S390X_CFA_OFFSET_ALIGNMENT_FACTOR,
};
use crate::table::{Arch, PcType, UnwindTable};

/// Output format version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteVersion {
    /// SFrame version 2, with PC-relative function starts.
    V2,
    /// SFrame version 3.
    V3,
}

/// How [`write_section`] encodes a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteOptions {
    /// The SFrame version to write.
    pub version: WriteVersion,
    /// Virtual address the section will be loaded at (FDE starts are PC-relative).
    pub section_vaddr: u64,
}

/// What the writer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WriteStats {
    /// FDEs written.
    pub fdes: u32,
    /// FREs (rows) written.
    pub fres: u32,
    /// `rule: None` rows, each of which ended an FDE.
    pub none_rows: u32,
    /// Extra FDEs caused by the v3 per-function row limit.
    pub splits: u32,
}

/// A contiguous run of rows that becomes one FDE.
struct Segment {
    func: usize,
    lo: usize,
    hi: usize,
    base: u32,
    size: u32,
}

/// One encoded row: info byte bits (without the size code) and data words.
#[derive(Clone, Copy)]
struct EncRow {
    base_sp: bool,
    mangled: bool,
    count: usize,
    /// (value, is unsigned control word)
    words: [(i64, bool); 6],
}

type Fail = &'static str;

struct Ctx {
    abi: Abi,
    fixed_ra: i8,
}

impl Ctx {
    fn dwarf(&self, base: CfaBase) -> u32 {
        let (sp, fp) = self.abi.sp_fp_dwarf();
        match base {
            CfaBase::Sp => u32::from(sp),
            CfaBase::Fp => u32::from(fp),
            CfaBase::Reg(r) => u32::from(r),
        }
    }

    fn cfa_off(&self, off: i32) -> Result<i64, Fail> {
        if self.abi != Abi::S390xBigEndian {
            return Ok(i64::from(off));
        }
        let adj = i64::from(off) + i64::from(S390X_CFA_OFFSET_ADJUSTMENT);
        let f = i64::from(S390X_CFA_OFFSET_ALIGNMENT_FACTOR);
        if adj % f != 0 {
            return Err("an s390x CFA offset that is not 160 + 8k");
        }
        Ok(adj / f)
    }

    fn empty(rule: &UnwindRule) -> EncRow {
        EncRow {
            base_sp: !matches!(rule.cfa.base, CfaBase::Fp),
            mangled: rule.flags.contains(RuleFlags::MANGLED_RA),
            count: 0,
            words: [(0, false); 6],
        }
    }

    /// The zero-word row of an RA-undefined rule: it keeps one bit of the CFA base.
    fn outermost(rule: &UnwindRule) -> Result<EncRow, Fail> {
        match rule.cfa.base {
            CfaBase::Reg(_) => Err("an outermost row with a CFA based on another register"),
            CfaBase::Sp | CfaBase::Fp => Ok(Self::empty(rule)),
        }
    }

    fn default_row(&self, rule: &UnwindRule, version: u8) -> Result<EncRow, Fail> {
        if rule.ra == RegRule::Undefined {
            return Self::outermost(rule);
        }
        let mut e = Self::empty(rule);
        if rule.cfa.deref {
            return Err("a dereferenced CFA");
        }
        e.base_sp = match rule.cfa.base {
            CfaBase::Sp => true,
            CfaBase::Fp => false,
            CfaBase::Reg(_) => return Err("a CFA based on a register other than SP/FP"),
        };
        let mut words: Vec<i64> = Vec::with_capacity(3);
        words.push(self.cfa_off(rule.cfa.offset)?);
        let s390x_regs = self.abi == Abi::S390xBigEndian && version == 2;
        let slot = |r: RegRule, what: Fail| -> Result<Option<i64>, Fail> {
            match r {
                RegRule::Unchanged => Ok(None),
                RegRule::AtCfa(o) if s390x_regs && o & 1 != 0 => Err(what),
                RegRule::AtCfa(o) => Ok(Some(i64::from(o))),
                RegRule::InReg(n) if s390x_regs => Ok(Some(i64::from(n) * 2 + 1)),
                _ => Err(what),
            }
        };
        let fp = slot(rule.fp, "this FP rule")?;
        if self.fixed_ra != 0 {
            if rule.ra != RegRule::AtCfa(i32::from(self.fixed_ra)) {
                return Err("an RA rule other than the fixed CFA-8 slot");
            }
            if let Some(f) = fp {
                words.push(f);
            }
        } else {
            let ra = slot(rule.ra, "this RA rule")?;
            if ra == Some(0) {
                return Err("RA = *(CFA+0) (0 is the padding value)");
            }
            match (ra, fp) {
                (None, None) => {}
                (Some(r), None) => words.push(r),
                (r, Some(f)) => {
                    words.push(r.unwrap_or(0));
                    words.push(f);
                }
            }
        }
        e.count = words.len();
        for (slot, w) in e.words.iter_mut().zip(words) {
            *slot = (w, false);
        }
        Ok(e)
    }

    fn flex_entity(&self, r: RegRule) -> Result<Option<(i64, i64)>, Fail> {
        Ok(Some(match r {
            RegRule::AtCfa(o) => (2, i64::from(o)),
            RegRule::InReg(n) => ((i64::from(n) << 3) | 1, 0),
            RegRule::AtReg { reg, offset } => ((i64::from(reg) << 3) | 3, i64::from(offset)),
            RegRule::Unchanged => return Ok(None),
            RegRule::ValCfa(_) => return Err("a value-of-CFA (val_offset) rule"),
            RegRule::Undefined => return Err("an undefined FP"),
        }))
    }

    fn flex_row(&self, rule: &UnwindRule) -> Result<EncRow, Fail> {
        if rule.ra == RegRule::Undefined {
            return Self::outermost(rule);
        }
        let mut e = Self::empty(rule);
        let mut words: Vec<(i64, bool)> = Vec::with_capacity(6);
        let ctrl =
            (i64::from(self.dwarf(rule.cfa.base)) << 3) | (i64::from(rule.cfa.deref) << 1) | 1;
        words.push((ctrl, true));
        words.push((self.cfa_off(rule.cfa.offset)?, false));
        let default_ra = if self.fixed_ra != 0 {
            RegRule::AtCfa(i32::from(self.fixed_ra))
        } else {
            RegRule::Unchanged
        };
        let ra = if rule.ra == default_ra {
            None
        } else {
            match self.flex_entity(rule.ra)? {
                Some(p) => Some(p),
                None => return Err("RA unchanged on an ABI with a fixed RA slot"),
            }
        };
        let fp = self.flex_entity(rule.fp)?;
        match ra {
            Some((c, o)) => {
                words.push((c, true));
                words.push((o, false));
            }
            None if fp.is_some() => words.push((0, true)),
            None => {}
        }
        if let Some((c, o)) = fp {
            words.push((c, true));
            words.push((o, false));
        }
        e.count = words.len();
        for (slot, w) in e.words.iter_mut().zip(words) {
            *slot = w;
        }
        Ok(e)
    }
}

fn size_code(row: &EncRow) -> Option<u8> {
    let fits = |bits: u32| {
        row.words.iter().take(row.count).all(|&(v, unsigned)| {
            if unsigned {
                v >= 0 && v < (1i64 << bits)
            } else {
                v >= -(1i64 << (bits - 1)) && v < (1i64 << (bits - 1))
            }
        })
    };
    [(0u8, 8u32), (1, 16), (2, 32)]
        .into_iter()
        .find(|&(_, b)| fits(b))
        .map(|(c, _)| c)
}

fn fre_type_for(size: u32) -> u8 {
    if size < 0x100 {
        0
    } else if size < 0x1_0000 {
        1
    } else {
        2
    }
}

fn abi_of(arch: Arch) -> (Abi, Endian) {
    match arch {
        Arch::Amd64 => (Abi::Amd64LittleEndian, Endian::Little),
        Arch::Aarch64 { big_endian: false } => (Abi::Aarch64LittleEndian, Endian::Little),
        Arch::Aarch64 { big_endian: true } => (Abi::Aarch64BigEndian, Endian::Big),
        Arch::S390x => (Abi::S390xBigEndian, Endian::Big),
    }
}

impl Ctx {
    fn new(abi: Abi) -> Ctx {
        let fixed_ra: i8 = if abi == Abi::Amd64LittleEndian { -8 } else { 0 };
        Ctx { abi, fixed_ra }
    }
}

impl WriteVersion {
    /// The version number in the header.
    pub const fn number(self) -> u8 {
        match self {
            WriteVersion::V2 => 2,
            WriteVersion::V3 => 3,
        }
    }
}

/// Whether [`write_section`] stores `rule` for `arch` in `version` so that it reads back
/// as it is, the one place that decides what a version can express: a row with this rule
/// is neither an [`WriteError::Unrepresentable`] error nor altered. RA-undefined rules
/// count as stored: their zero-word rows keep, by design, only the CFA base and the flags.
///
/// Per-function consistency (one signal flag and one pointer-authentication key per
/// function) is not a property of one rule and is not checked here.
pub fn stores_rule(arch: Arch, version: WriteVersion, rule: &UnwindRule) -> bool {
    let (abi, _) = abi_of(arch);
    let v3 = version == WriteVersion::V3;
    if rule.flags.contains(RuleFlags::SIGNAL) && !v3 {
        return false;
    }
    if rule.flags.contains(RuleFlags::MANGLED_RA) && !abi.is_aarch64() {
        return false;
    }
    let ctx = Ctx::new(abi);
    let fits = |row: Result<EncRow, Fail>| row.ok().and_then(|r| size_code(&r)).is_some();
    fits(ctx.default_row(rule, version.number())) || (v3 && fits(ctx.flex_row(rule)))
}

/// Encode `table` as an SFrame section of the requested version.
pub fn write_section(
    table: &UnwindTable,
    opts: &WriteOptions,
) -> Result<(Vec<u8>, WriteStats), WriteError> {
    let (abi, endian) = abi_of(table.arch);
    let v3 = opts.version == WriteVersion::V3;
    let version = opts.version.number();
    let ctx = Ctx::new(abi);
    let fixed_ra = ctx.fixed_ra;
    let mut stats = WriteStats::default();
    let max_rows = if v3 {
        usize::from(u16::MAX)
    } else {
        u32::MAX as usize
    };

    // Functions in address order, cut into segments (one FDE each).
    let functions = table.functions();
    let mut order: Vec<usize> = (0..functions.len()).collect();
    order.sort_by_key(|&i| functions.get(i).map_or(0, |f| f.start));
    let mut segments: Vec<Segment> = Vec::new();
    for &fi in &order {
        let Some(f) = functions.get(fi) else {
            continue;
        };
        let mut prev: Option<u32> = None;
        for (ri, row) in table.rows(f).enumerate() {
            if prev.is_some_and(|p| row.start_offset <= p) || row.start_offset > f.size {
                return Err(WriteError::BadRowOrder {
                    function: fi,
                    row: ri,
                    start: row.start_offset,
                    size: f.size,
                });
            }
            prev = Some(row.start_offset);
        }
        if let PcType::Mask { .. } = f.pc_type {
            if let Some(ri) = table.rows(f).position(|r| r.rule.is_none()) {
                return Err(WriteError::NoneRowInMaskFunction {
                    function: fi,
                    row: ri,
                });
            }
            if f.row_count() > max_rows {
                return Err(WriteError::TooManyRows {
                    function: fi,
                    count: f.row_count(),
                });
            }
            segments.push(Segment {
                func: fi,
                lo: 0,
                hi: f.row_count(),
                base: 0,
                size: f.size,
            });
            continue;
        }
        if f.row_count() == 0 {
            segments.push(Segment {
                func: fi,
                lo: 0,
                hi: 0,
                base: 0,
                size: f.size,
            });
            continue;
        }
        // Open segment: (first row, base offset).
        let mut open: Option<(usize, u32)> = None;
        for (ri, row) in table.rows(f).enumerate() {
            match (row.rule.is_some(), open) {
                (true, None) => open = Some((ri, if ri == 0 { 0 } else { row.start_offset })),
                (true, Some((lo, base))) if ri - lo >= max_rows => {
                    segments.push(Segment {
                        func: fi,
                        lo,
                        hi: ri,
                        base,
                        size: row.start_offset - base,
                    });
                    stats.splits += 1;
                    open = Some((ri, row.start_offset));
                }
                (true, Some(_)) => {}
                (false, o) => {
                    stats.none_rows += 1;
                    if let Some((lo, base)) = o {
                        segments.push(Segment {
                            func: fi,
                            lo,
                            hi: ri,
                            base,
                            size: row.start_offset - base,
                        });
                    }
                    open = None;
                }
            }
        }
        if let Some((lo, base)) = open {
            segments.push(Segment {
                func: fi,
                lo,
                hi: f.row_count(),
                base,
                size: f.size - base,
            });
        }
    }

    let fde_size = if v3 { FDE_SIZE_V3 } else { FDE_SIZE_V2 };
    let num_fdes =
        u32::try_from(segments.len()).map_err(|_| WriteError::TooLarge { what: "FDE count" })?;
    let fde_bytes = segments.len() * fde_size;
    let mut fdes: Vec<u8> = Vec::with_capacity(fde_bytes);
    let mut fres: Vec<u8> = Vec::new();
    for (k, seg) in segments.iter().enumerate() {
        let Some(f) = functions.get(seg.func) else {
            continue;
        };
        let Some(rows) = table.rows(f).sub(seg.lo, seg.hi) else {
            continue;
        };
        let rules = rows
            .clone()
            .enumerate()
            .filter_map(|(i, r)| r.rule.map(|rule| (seg.lo + i, rule)));
        // Per-function flags.
        let mut signal: Option<bool> = None;
        let mut key_b: Option<bool> = None;
        for (ri, rule) in rules.clone() {
            let s = rule.flags.contains(RuleFlags::SIGNAL);
            if *signal.get_or_insert(s) != s {
                return Err(WriteError::InconsistentFunction {
                    function: seg.func,
                    what: "the signal-frame flag",
                });
            }
            if s && !v3 {
                return Err(WriteError::Unrepresentable {
                    function: seg.func,
                    row: ri,
                    version,
                    what: "a signal frame",
                });
            }
            if rule.flags.contains(RuleFlags::MANGLED_RA) {
                if !abi.is_aarch64() {
                    return Err(WriteError::Unrepresentable {
                        function: seg.func,
                        row: ri,
                        version,
                        what: "a mangled RA off AArch64",
                    });
                }
                let b = rule.flags.contains(RuleFlags::PAUTH_KEY_B);
                if *key_b.get_or_insert(b) != b {
                    return Err(WriteError::InconsistentFunction {
                        function: seg.func,
                        what: "the pointer-authentication key",
                    });
                }
            }
        }
        // Default encoding if every row fits, else FLEX (v3).
        let mut flex = false;
        for (ri, rule) in rules.clone() {
            if let Err(what) = ctx.default_row(&rule, version) {
                if !v3 {
                    return Err(WriteError::Unrepresentable {
                        function: seg.func,
                        row: ri,
                        version,
                        what,
                    });
                }
                flex = true;
                break;
            }
        }
        let fre_type = fre_type_for(seg.size);
        let (pc_type_bit, rep_size) = match f.pc_type {
            PcType::Inc => (0u8, 0u8),
            PcType::Mask { rep_size } => (1, rep_size),
        };
        let info = fre_type
            | (pc_type_bit << 4)
            | (u8::from(key_b == Some(true)) << 5)
            | (u8::from(signal == Some(true) && v3) << 7);
        let fre_off = u32::try_from(fres.len()).map_err(|_| WriteError::TooLarge {
            what: "FRE sub-section",
        })?;
        let num_fres = rows.len();
        if v3 {
            let n = u16::try_from(num_fres).map_err(|_| WriteError::TooManyRows {
                function: seg.func,
                count: num_fres,
            })?;
            fres.extend_from_slice(&endian.put_u16(n));
            fres.extend_from_slice(&[info, u8::from(flex), rep_size]);
        }
        for (ri, rule) in rules {
            let row = rows.get(ri - seg.lo).map_or(0, |r| r.start_offset) - seg.base;
            let enc = if flex {
                ctx.flex_row(&rule)
            } else {
                ctx.default_row(&rule, version)
            }
            .map_err(|what| WriteError::Unrepresentable {
                function: seg.func,
                row: ri,
                version,
                what,
            })?;
            let code = size_code(&enc).ok_or(WriteError::Unrepresentable {
                function: seg.func,
                row: ri,
                version,
                what: "a data word wider than 32 bits",
            })?;
            match fre_type {
                0 => fres.push(row as u8),
                1 => fres.extend_from_slice(&endian.put_u16(row as u16)),
                _ => fres.extend_from_slice(&endian.put_u32(row)),
            }
            let fre_info = u8::from(enc.base_sp)
                | ((enc.count as u8) << 1)
                | (code << 5)
                | (u8::from(enc.mangled) << 7);
            fres.push(fre_info);
            for &(v, _) in enc.words.iter().take(enc.count) {
                match code {
                    0 => fres.push(v as u8),
                    1 => fres.extend_from_slice(&endian.put_u16(v as u16)),
                    _ => fres.extend_from_slice(&endian.put_u32(v as u32)),
                }
            }
            stats.fres += 1;
        }
        // FDE (v3: index entry), PC-relative to its own start field.
        let field = u128::from(opts.section_vaddr) + (HEADER_SIZE + k * fde_size) as u128;
        let start = u128::from(f.start) + u128::from(seg.base);
        let rel = start as i128 - field as i128;
        if v3 {
            // A reader adds the field's offset back (the start from the section's
            // start): that sum must fit in 64 signed bits too.
            let from_section = start as i128 - i128::from(opts.section_vaddr);
            let rel = i64::try_from(rel)
                .ok()
                .filter(|_| i64::try_from(from_section).is_ok())
                .ok_or(WriteError::StartOutOfRange { function: seg.func })?;
            fdes.extend_from_slice(&endian.put_u64(rel as u64));
            fdes.extend_from_slice(&endian.put_u32(seg.size));
            fdes.extend_from_slice(&endian.put_u32(fre_off));
        } else {
            let rel = i32::try_from(rel)
                .map_err(|_| WriteError::StartOutOfRange { function: seg.func })?;
            let n = u32::try_from(num_fres).map_err(|_| WriteError::TooManyRows {
                function: seg.func,
                count: num_fres,
            })?;
            fdes.extend_from_slice(&endian.put_u32(rel as u32));
            fdes.extend_from_slice(&endian.put_u32(seg.size));
            fdes.extend_from_slice(&endian.put_u32(fre_off));
            fdes.extend_from_slice(&endian.put_u32(n));
            fdes.extend_from_slice(&[info, rep_size, 0, 0]);
        }
        stats.fdes += 1;
    }
    let fre_len = u32::try_from(fres.len()).map_err(|_| WriteError::TooLarge {
        what: "FRE sub-section",
    })?;
    let freoff = u32::try_from(fde_bytes).map_err(|_| WriteError::TooLarge {
        what: "FDE sub-section",
    })?;
    let mut out = Vec::with_capacity(HEADER_SIZE + fdes.len() + fres.len());
    out.extend_from_slice(&endian.put_u16(MAGIC));
    out.push(version);
    out.push(F_FDE_SORTED | F_FDE_FUNC_START_PCREL);
    out.push(abi.code());
    out.push(0); // fixed FP offset: none
    out.push(fixed_ra as u8);
    out.push(0); // no auxiliary header
    out.extend_from_slice(&endian.put_u32(num_fdes));
    out.extend_from_slice(&endian.put_u32(stats.fres));
    out.extend_from_slice(&endian.put_u32(fre_len));
    out.extend_from_slice(&endian.put_u32(0));
    out.extend_from_slice(&endian.put_u32(freoff));
    out.extend_from_slice(&fdes);
    out.extend_from_slice(&fres);
    Ok((out, stats))
}
