//! Zero-copy reader: [`Section`] over the section bytes, validated once at open.
//!
//! `Section::parse` walks every FDE and FRE and checks the whole section (see
//! [`SFrameError`] for the list of checks); afterwards the iterators and lookups cannot
//! fail. The only allocation is a private sort index, built only when the section does
//! not carry `SFRAME_F_FDE_SORTED` (its size is bounded by the FDE count, which is
//! checked against the section size first).

use sframe_common::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};

use super::error::{FlexProblem, SFrameError, Subsection};
use super::header::{
    Abi, Endian, FDE_ATTR_SIZE_V3, Header, S390X_CFA_OFFSET_ADJUSTMENT,
    S390X_CFA_OFFSET_ALIGNMENT_FACTOR, bytes,
};
use crate::table::{Arch, Function, PcType, Row, Source, UnwindTable};

/// The maximum number of data words an FRE info byte can announce (4-bit field).
pub const MAX_WORDS: usize = 15;

/// One function descriptor, decoded (v1/v2 FDE, or v3 index entry + attribute record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fde {
    /// Index in on-disk order.
    pub index: u32,
    /// Byte offset of the FDE (index entry) in the section.
    pub offset: usize,
    /// Function start relative to the start of the section (libsframe's "secrel").
    pub rel_start: i64,
    /// Absolute function start: section address + `rel_start` (wrapping, as libsframe).
    pub start: u64,
    pub size: u32,
    pub num_fres: u32,
    /// FRE start-address width code (0: 1 byte, 1: 2 bytes, 2: 4 bytes).
    pub fre_type: u8,
    pub pc_type: PcType,
    /// The raw info byte(s) and rep_size as stored.
    pub info: u8,
    pub info2: u8,
    pub rep_size: u8,
    pub pauth_key_b: bool,
    pub signal: bool,
    /// v3 FLEX FDE type.
    pub flex: bool,
    /// Byte offset in the section of the function's first FRE.
    pub fres_offset: usize,
}

impl Fde {
    /// Start-address width in bytes.
    pub fn addr_size(&self) -> usize {
        match self.fre_type {
            0 => 1,
            1 => 2,
            _ => 4,
        }
    }
}

/// One frame row entry, decoded but not interpreted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fre {
    /// Index within its function.
    pub index: u32,
    /// Byte offset of the FRE in the section.
    pub offset: usize,
    /// Start offset relative to the function start (a mask offset for PCMASK).
    pub start_offset: u32,
    pub info: u8,
    /// Raw data words, zero-extended (`count()` of them are valid).
    pub words: [u32; MAX_WORDS],
    /// Encoded length in bytes.
    pub len: usize,
}

impl Fre {
    /// Data word count (0 means "RA undefined": outermost frame).
    pub fn count(&self) -> usize {
        usize::from((self.info >> 1) & 0xf)
    }
    /// Data word size code (0/1/2 valid).
    pub fn size_code(&self) -> u8 {
        (self.info >> 5) & 0x3
    }
    pub fn word_size(&self) -> usize {
        match self.size_code() {
            0 => 1,
            1 => 2,
            _ => 4,
        }
    }
    /// CFA base register bit: true for SP, false for FP.
    pub fn base_is_sp(&self) -> bool {
        self.info & 1 != 0
    }
    pub fn mangled_ra(&self) -> bool {
        self.info & 0x80 != 0
    }
    /// Word `i` as unsigned (FLEX control words).
    pub fn uword(&self, i: usize) -> Option<u32> {
        if i < self.count() {
            self.words.get(i).copied()
        } else {
            None
        }
    }
    /// Word `i` sign-extended from its width (offsets).
    pub fn iword(&self, i: usize) -> Option<i32> {
        let w = self.uword(i)?;
        Some(match self.word_size() {
            1 => i32::from(w as u8 as i8),
            2 => i32::from(w as u16 as i16),
            _ => w as i32,
        })
    }
}

/// A validated SFrame section.
#[derive(Clone, Debug)]
pub struct Section<'a> {
    data: &'a [u8],
    vaddr: u64,
    header: Header,
    fdes_start: usize,
    fres_start: usize,
    fres_end: usize,
    /// FDE indices in address order, only when the section is not SORTED.
    sorted_index: Option<Vec<u32>>,
}

fn read_start_addr(data: &[u8], off: usize, fre_type: u8, e: Endian) -> Option<u32> {
    match fre_type {
        0 => data.get(off).map(|b| u32::from(*b)),
        1 => bytes::<2>(data, off).map(|b| u32::from(e.u16(b))),
        _ => bytes::<4>(data, off).map(|b| e.u32(b)),
    }
}

/// Decode the FRE at `off`, which must end by `end`. `Err(true)` means out of bounds,
/// `Err(false)` an invalid data word size code.
fn decode_fre(
    data: &[u8],
    off: usize,
    end: usize,
    fre_type: u8,
    addr_size: usize,
    e: Endian,
    index: u32,
) -> Result<Fre, bool> {
    let limit = data.get(..end).ok_or(true)?;
    let start_offset = read_start_addr(limit, off, fre_type, e).ok_or(true)?;
    let info_off = off.checked_add(addr_size).ok_or(true)?;
    let info = *limit.get(info_off).ok_or(true)?;
    let mut fre = Fre {
        index,
        offset: off,
        start_offset,
        info,
        words: [0; MAX_WORDS],
        len: 0,
    };
    if fre.size_code() == 3 {
        return Err(false);
    }
    let ws = fre.word_size();
    let count = fre.count();
    let mut p = info_off + 1;
    for slot in fre.words.iter_mut().take(count) {
        *slot = match ws {
            1 => u32::from(*limit.get(p).ok_or(true)?),
            2 => u32::from(e.u16(bytes::<2>(limit, p).ok_or(true)?)),
            _ => e.u32(bytes::<4>(limit, p).ok_or(true)?),
        };
        p += ws;
    }
    fre.len = p - off;
    Ok(fre)
}

impl<'a> Section<'a> {
    /// Parse and fully validate the bytes of an `.sframe` section loaded at `section_vaddr`.
    pub fn parse(data: &'a [u8], section_vaddr: u64) -> Result<Self, SFrameError> {
        let header = Header::parse(data)?;
        let hsize = header.size();
        let len = data.len();
        if header.fdeoff > header.freoff {
            return Err(SFrameError::SubsectionOrder {
                fdeoff: header.fdeoff,
                freoff: header.freoff,
            });
        }
        let fde_size = header.fde_size() as u64;
        let fde_bytes = u64::from(header.num_fdes) * fde_size;
        let fdes_start = hsize as u64 + u64::from(header.fdeoff);
        if fdes_start + fde_bytes > len as u64 {
            return Err(SFrameError::SubsectionOutOfBounds {
                which: Subsection::Fdes,
                start: fdes_start,
                len: fde_bytes,
                section_len: len,
            });
        }
        let space = u64::from(header.freoff - header.fdeoff);
        if fde_bytes != space {
            return Err(SFrameError::FdeCountMismatch {
                num_fdes: header.num_fdes,
                fde_size: fde_size as u32,
                space,
                offset: fdes_start as usize,
            });
        }
        let fres_start = hsize as u64 + u64::from(header.freoff);
        let fres_end = fres_start + u64::from(header.fre_len);
        if fres_end > len as u64 {
            return Err(SFrameError::SubsectionOutOfBounds {
                which: Subsection::Fres,
                start: fres_start,
                len: u64::from(header.fre_len),
                section_len: len,
            });
        }
        // All offsets now fit in the slice, hence in usize.
        let (fdes_start, fres_start, fres_end) =
            (fdes_start as usize, fres_start as usize, fres_end as usize);
        if let Some(pos) = data
            .get(fres_end..)
            .and_then(|t| t.iter().position(|b| *b != 0))
        {
            return Err(SFrameError::TrailingData {
                offset: fres_end + pos,
            });
        }
        let mut section = Section {
            data,
            vaddr: section_vaddr,
            header,
            fdes_start,
            fres_start,
            fres_end,
            sorted_index: None,
        };
        section.validate()?;
        Ok(section)
    }

    /// Open the `.sframe` section of a parsed ELF file.
    pub fn from_elf(file: &object::File<'a>) -> Result<Self, SFrameError> {
        use object::{Object, ObjectSection};
        let sec = file.section_by_name(".sframe").ok_or(SFrameError::Elf {
            what: "no .sframe section",
        })?;
        let data = sec.data().map_err(|_| SFrameError::Elf {
            what: ".sframe data unreadable",
        })?;
        Section::parse(data, sec.address())
    }

    /// Open the `.sframe` section of an ELF image given as bytes.
    pub fn from_elf_bytes(elf: &'a [u8]) -> Result<Self, SFrameError> {
        let file = object::File::parse(elf).map_err(|_| SFrameError::Elf {
            what: "not a readable ELF file",
        })?;
        Section::from_elf(&file)
    }

    pub fn header(&self) -> &Header {
        &self.header
    }
    pub fn version(&self) -> u8 {
        self.header.version
    }
    pub fn abi(&self) -> Abi {
        self.header.abi
    }
    pub fn section_vaddr(&self) -> u64 {
        self.vaddr
    }
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
    pub fn num_fdes(&self) -> u32 {
        self.header.num_fdes
    }

    /// The architecture in the shared table type.
    pub fn arch(&self) -> Arch {
        match self.header.abi {
            Abi::Amd64LittleEndian => Arch::Amd64,
            Abi::Aarch64BigEndian => Arch::Aarch64 { big_endian: true },
            Abi::Aarch64LittleEndian => Arch::Aarch64 { big_endian: false },
            Abi::S390xBigEndian => Arch::S390x,
        }
    }

    /// Decode FDE `index` (on-disk order) without validation.
    fn decode_fde(&self, index: u32) -> Result<Fde, SFrameError> {
        let h = &self.header;
        let e = h.endian;
        let d = self.data;
        let off = self.fdes_start + index as usize * h.fde_size();
        let oob = SFrameError::SubsectionOutOfBounds {
            which: Subsection::Fdes,
            start: off as u64,
            len: h.fde_size() as u64,
            section_len: d.len(),
        };
        let u32_at = |o: usize| bytes::<4>(d, off + o).map(|b| e.u32(b)).ok_or(oob);
        let (raw_start, size, fre_off) = if h.version == 3 {
            let s = bytes::<8>(d, off).map(|b| e.u64(b) as i64).ok_or(oob)?;
            (s, u32_at(8)?, u32_at(12)?)
        } else {
            (i64::from(u32_at(0)? as i32), u32_at(4)?, u32_at(8)?)
        };
        let fre_data = self.fres_start as u64 + u64::from(fre_off);
        let (num_fres, info, info2, rep_size, fres_offset) = if h.version == 3 {
            let attr = fre_data;
            if attr + FDE_ATTR_SIZE_V3 as u64 > self.fres_end as u64 {
                return Err(SFrameError::FreDataOutOfBounds {
                    fde: index,
                    offset: attr,
                    len: FDE_ATTR_SIZE_V3 as u64,
                });
            }
            let a = attr as usize;
            let b = bytes::<5>(d, a).ok_or(SFrameError::FreDataOutOfBounds {
                fde: index,
                offset: attr,
                len: FDE_ATTR_SIZE_V3 as u64,
            })?;
            (
                u32::from(e.u16([b[0], b[1]])),
                b[2],
                b[3],
                b[4],
                a + FDE_ATTR_SIZE_V3,
            )
        } else {
            let n = u32_at(12)?;
            let info = *d.get(off + 16).ok_or(oob)?;
            let rep = if h.version == 2 {
                *d.get(off + 17).ok_or(oob)?
            } else {
                0
            };
            if fre_data > self.fres_end as u64 {
                return Err(SFrameError::FreDataOutOfBounds {
                    fde: index,
                    offset: fre_data,
                    len: 0,
                });
            }
            (n, info, 0, rep, fre_data as usize)
        };
        let rel_start = if h.pcrel() {
            raw_start
                .checked_add(off as i64)
                .ok_or(SFrameError::FunctionStartOverflow {
                    fde: index,
                    offset: off,
                })?
        } else {
            raw_start
        };
        let fre_type = info & 0xf;
        if fre_type > 2 {
            return Err(SFrameError::InvalidFreType {
                fde: index,
                offset: off,
                code: fre_type,
            });
        }
        let reserved = if h.version == 3 {
            info & 0x40
        } else {
            info & 0xc0
        };
        let pauth = info & 0x20 != 0;
        if reserved != 0 || (pauth && !h.abi.is_aarch64()) {
            return Err(SFrameError::FdeReservedBits {
                fde: index,
                offset: off,
                value: info,
            });
        }
        let mut flex = false;
        if h.version == 3 {
            if info2 & 0xe0 != 0 {
                return Err(SFrameError::FdeReservedBits {
                    fde: index,
                    offset: off,
                    value: info2,
                });
            }
            match info2 & 0x1f {
                0 => {}
                1 => flex = true,
                code => {
                    return Err(SFrameError::InvalidFdeType {
                        fde: index,
                        offset: off,
                        code,
                    });
                }
            }
        }
        let pc_type = if info & 0x10 != 0 {
            match h.version {
                1 if h.abi == Abi::Amd64LittleEndian => PcType::Mask { rep_size: 16 },
                1 => {
                    return Err(SFrameError::V1PcMaskUnsupported {
                        fde: index,
                        offset: off,
                    });
                }
                _ if rep_size == 0 => {
                    return Err(SFrameError::ZeroRepSize {
                        fde: index,
                        offset: off,
                    });
                }
                _ => PcType::Mask { rep_size },
            }
        } else {
            PcType::Inc
        };
        Ok(Fde {
            index,
            offset: off,
            rel_start,
            start: self.vaddr.wrapping_add(rel_start as u64),
            size,
            num_fres,
            fre_type,
            pc_type,
            info,
            info2,
            rep_size,
            pauth_key_b: pauth,
            signal: h.version == 3 && info & 0x80 != 0,
            flex,
            fres_offset,
        })
    }

    /// Walk every FDE and FRE once and apply all checks.
    fn validate(&mut self) -> Result<(), SFrameError> {
        let h = self.header;
        let mut total_fres: u64 = 0;
        let mut used: u64 = 0;
        let mut prev_start: Option<i64> = None;
        let mut unsorted = false;
        // FRE data ranges: checked for overlap on the fly while they are in order;
        // otherwise collected (bounded by the FDE count) and checked after sorting.
        let mut prev_range: Option<(usize, usize)> = None;
        let mut ranges_out_of_order = false;
        for i in 0..h.num_fdes {
            let fde = self.decode_fde(i)?;
            if let Some(p) = prev_start
                && fde.rel_start < p
            {
                if h.sorted() {
                    return Err(SFrameError::FdesNotSorted {
                        fde: i,
                        offset: fde.offset,
                    });
                }
                unsorted = true;
            }
            prev_start = Some(fde.rel_start);
            let data_start = if h.version == 3 {
                fde.fres_offset - FDE_ATTR_SIZE_V3
            } else {
                fde.fres_offset
            };
            let mut off = fde.fres_offset;
            let mut prev: Option<u32> = None;
            for j in 0..fde.num_fres {
                let fre = self.check_fre(&fde, j, off, prev)?;
                prev = Some(fre.start_offset);
                off += fre.len;
            }
            total_fres += u64::from(fde.num_fres);
            used += (off - data_start) as u64;
            if off > data_start {
                if let Some((_, pend)) = prev_range {
                    if data_start >= pend {
                        // in order, no overlap
                    } else {
                        ranges_out_of_order = true;
                    }
                }
                if !ranges_out_of_order {
                    prev_range = Some((data_start, off));
                }
            }
        }
        if total_fres != u64::from(h.num_fres) {
            return Err(SFrameError::FreCountMismatch {
                header: h.num_fres,
                found: total_fres,
            });
        }
        if used != u64::from(h.fre_len) {
            return Err(SFrameError::FreLenMismatch {
                header: h.fre_len,
                used,
            });
        }
        if ranges_out_of_order {
            let mut ranges = Vec::with_capacity(h.num_fdes as usize);
            for i in 0..h.num_fdes {
                let fde = self.decode_fde(i)?;
                let start = if h.version == 3 {
                    fde.fres_offset - FDE_ATTR_SIZE_V3
                } else {
                    fde.fres_offset
                };
                let end = self
                    .rows(&fde)
                    .last()
                    .map_or(fde.fres_offset, |f| f.offset + f.len);
                if end > start {
                    ranges.push((start, end, i));
                }
            }
            ranges.sort_unstable();
            for w in ranges.windows(2) {
                if let [a, b] = w
                    && b.0 < a.1
                {
                    return Err(SFrameError::FreDataOverlap {
                        fde: a.2.max(b.2),
                        offset: b.0,
                    });
                }
            }
        }
        if unsorted {
            let mut idx: Vec<(i64, u32)> = Vec::with_capacity(h.num_fdes as usize);
            for i in 0..h.num_fdes {
                idx.push((self.decode_fde(i)?.rel_start, i));
            }
            idx.sort_unstable();
            self.sorted_index = Some(idx.into_iter().map(|(_, i)| i).collect());
        }
        Ok(())
    }

    fn check_fre(
        &self,
        fde: &Fde,
        j: u32,
        off: usize,
        prev: Option<u32>,
    ) -> Result<Fre, SFrameError> {
        let h = &self.header;
        let fre = decode_fre(
            self.data,
            off,
            self.fres_end,
            fde.fre_type,
            fde.addr_size(),
            h.endian,
            j,
        )
        .map_err(|oob| {
            if oob {
                SFrameError::FreDataOutOfBounds {
                    fde: fde.index,
                    offset: off as u64,
                    len: fde.addr_size() as u64 + 1,
                }
            } else {
                let info = self.data.get(off + fde.addr_size()).copied().unwrap_or(0);
                SFrameError::InvalidDataWordSize {
                    fde: fde.index,
                    fre: j,
                    offset: off,
                    code: (info >> 5) & 3,
                }
            }
        })?;
        if let Some(p) = prev
            && fre.start_offset <= p
        {
            return Err(SFrameError::FreStartNotIncreasing {
                fde: fde.index,
                fre: j,
                offset: off,
                start: fre.start_offset,
            });
        }
        if fre.start_offset > fde.size {
            return Err(SFrameError::FreStartBeyondFunction {
                fde: fde.index,
                fre: j,
                offset: off,
                start: fre.start_offset,
                size: fde.size,
            });
        }
        if fre.mangled_ra() && !h.abi.is_aarch64() {
            return Err(SFrameError::FreReservedBits {
                fde: fde.index,
                fre: j,
                offset: off,
                value: fre.info,
            });
        }
        let count = fre.count();
        if count == 0 {
            if h.version == 1 {
                return Err(SFrameError::EmptyFreInV1 {
                    fde: fde.index,
                    fre: j,
                    offset: off,
                });
            }
            return Ok(fre);
        }
        if fde.flex {
            self.try_rule(fde, &fre)
                .map_err(|problem| SFrameError::BadFlexRule {
                    fde: fde.index,
                    fre: j,
                    offset: off,
                    problem,
                })?;
        } else {
            let max = if h.cfa_fixed_ra_offset != 0 { 2 } else { 3 };
            if count > max {
                return Err(SFrameError::LeftoverDataWords {
                    fde: fde.index,
                    fre: j,
                    offset: off,
                    count: count as u8,
                    max: max as u8,
                });
            }
        }
        Ok(fre)
    }

    /// All FDEs in on-disk order.
    pub fn functions(&self) -> impl Iterator<Item = Fde> + '_ {
        (0..self.header.num_fdes).filter_map(move |i| self.decode_fde(i).ok())
    }

    /// FDE `index` in on-disk order.
    pub fn fde(&self, index: u32) -> Option<Fde> {
        if index < self.header.num_fdes {
            self.decode_fde(index).ok()
        } else {
            None
        }
    }

    /// The `k`-th FDE in address order.
    pub fn fde_sorted(&self, k: u32) -> Option<Fde> {
        match &self.sorted_index {
            Some(idx) => self.fde(*idx.get(k as usize)?),
            None => self.fde(k),
        }
    }

    /// All FDEs in address order.
    pub fn functions_sorted(&self) -> impl Iterator<Item = Fde> + '_ {
        (0..self.header.num_fdes).filter_map(move |k| self.fde_sorted(k))
    }

    /// The rows (FREs) of a function.
    pub fn rows<'s>(&'s self, fde: &Fde) -> FreIter<'s, 'a> {
        FreIter {
            section: self,
            fde: *fde,
            next: 0,
            off: fde.fres_offset,
        }
    }

    fn s390x_cfa(&self, off: i32) -> i32 {
        if self.header.abi == Abi::S390xBigEndian {
            off.wrapping_mul(S390X_CFA_OFFSET_ALIGNMENT_FACTOR)
                .wrapping_sub(S390X_CFA_OFFSET_ADJUSTMENT)
        } else {
            off
        }
    }

    fn base_from_dwarf(&self, reg: u32) -> Result<CfaBase, FlexProblem> {
        let (sp, fp) = self.header.abi.sp_fp_dwarf();
        let reg = u16::try_from(reg).map_err(|_| FlexProblem::ReservedBit)?;
        Ok(if reg == sp {
            CfaBase::Sp
        } else if reg == fp {
            CfaBase::Fp
        } else {
            CfaBase::Reg(reg)
        })
    }

    /// The normalized rule of a row. Infallible for rows of a validated section.
    pub fn rule(&self, fde: &Fde, fre: &Fre) -> UnwindRule {
        self.try_rule(fde, fre).unwrap_or(UnwindRule {
            cfa: CfaRule::sp(0),
            ra: RegRule::Undefined,
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        })
    }

    fn try_rule(&self, fde: &Fde, fre: &Fre) -> Result<UnwindRule, FlexProblem> {
        let h = &self.header;
        let mut flags = RuleFlags::default();
        if fde.signal {
            flags = flags.with(RuleFlags::SIGNAL);
        }
        if fre.mangled_ra() {
            flags = flags.with(RuleFlags::MANGLED_RA);
            if fde.pauth_key_b {
                flags = flags.with(RuleFlags::PAUTH_KEY_B);
            }
        }
        let base = if fre.base_is_sp() {
            CfaBase::Sp
        } else {
            CfaBase::Fp
        };
        let default_ra = if h.cfa_fixed_ra_offset != 0 {
            RegRule::AtCfa(i32::from(h.cfa_fixed_ra_offset))
        } else {
            RegRule::Unchanged
        };
        let default_fp = if h.cfa_fixed_fp_offset != 0 {
            RegRule::AtCfa(i32::from(h.cfa_fixed_fp_offset))
        } else {
            RegRule::Unchanged
        };
        if fre.count() == 0 {
            return Ok(UnwindRule {
                cfa: CfaRule {
                    base,
                    offset: 0,
                    deref: false,
                },
                ra: RegRule::Undefined,
                fp: RegRule::Unchanged,
                flags,
            });
        }
        let w = |i: usize| fre.iword(i).unwrap_or(0);
        if !fde.flex {
            let cfa = CfaRule {
                base,
                offset: self.s390x_cfa(w(0)),
                deref: false,
            };
            // s390x v2 encodes "saved in register N" as an odd offset 2N+1.
            let s390x_regs = h.abi == Abi::S390xBigEndian && h.version == 2;
            let decode = |v: i32| {
                if s390x_regs && v & 1 != 0 {
                    RegRule::InReg((v >> 1) as u16)
                } else {
                    RegRule::AtCfa(v)
                }
            };
            let (ra, fp_idx) = if h.cfa_fixed_ra_offset != 0 {
                (default_ra, 1)
            } else {
                let ra = match fre.iword(1) {
                    // SFRAME_FRE_RA_OFFSET_INVALID: padding, RA not saved.
                    Some(0) | None => RegRule::Unchanged,
                    Some(v) => decode(v),
                };
                (ra, 2)
            };
            let fp = if h.cfa_fixed_fp_offset != 0 {
                default_fp
            } else {
                fre.iword(fp_idx).map_or(RegRule::Unchanged, decode)
            };
            return Ok(UnwindRule { cfa, ra, fp, flags });
        }
        // FLEX: (control, offset) pairs for CFA, RA, FP; a 0 control word is padding.
        let count = fre.count();
        if count < 2 {
            return Err(FlexProblem::MissingOffset);
        }
        let c0 = fre.uword(0).unwrap_or(0);
        if c0 & 4 != 0 {
            return Err(FlexProblem::ReservedBit);
        }
        if c0 & 1 == 0 {
            return Err(FlexProblem::CfaNotRegister);
        }
        let cfa = CfaRule {
            base: self.base_from_dwarf(c0 >> 3)?,
            offset: self.s390x_cfa(w(1)),
            deref: c0 & 2 != 0,
        };
        let entity = |i: usize| -> Result<(Option<RegRule>, usize), FlexProblem> {
            match fre.uword(i) {
                None => Ok((None, i)),
                Some(0) => Ok((None, i + 1)),
                Some(c) => {
                    let off = fre.iword(i + 1).ok_or(FlexProblem::MissingOffset)?;
                    if c & 4 != 0 {
                        return Err(FlexProblem::ReservedBit);
                    }
                    let reg = u16::try_from(c >> 3).map_err(|_| FlexProblem::ReservedBit)?;
                    let rule = match (c & 1 != 0, c & 2 != 0) {
                        (false, true) => RegRule::AtCfa(off),
                        (false, false) => RegRule::ValCfa(off),
                        (true, true) => RegRule::AtReg { reg, offset: off },
                        (true, false) if off == 0 => RegRule::InReg(reg),
                        (true, false) => return Err(FlexProblem::RegPlusOffset),
                    };
                    Ok((Some(rule), i + 2))
                }
            }
        };
        let (ra, next) = entity(2)?;
        let (fp, end) = entity(next)?;
        if fp.is_none() && end > next && end != count {
            // An FP padding word must be the last word.
            return Err(FlexProblem::Leftover);
        }
        if end < count {
            return Err(FlexProblem::Leftover);
        }
        Ok(UnwindRule {
            cfa,
            ra: ra.unwrap_or(default_ra),
            fp: fp.unwrap_or(default_fp),
            flags,
        })
    }

    /// Convert the whole section to the shared table type (functions in address order).
    pub fn to_table(&self) -> Result<UnwindTable, SFrameError> {
        let mut functions = Vec::with_capacity(self.header.num_fdes as usize);
        for fde in self.functions_sorted() {
            let rows = self
                .rows(&fde)
                .map(|fre| Row {
                    start_offset: fre.start_offset,
                    rule: Some(self.rule(&fde, &fre)),
                })
                .collect();
            functions.push(Function {
                start: fde.start,
                size: fde.size,
                pc_type: fde.pc_type,
                rows,
            });
        }
        Ok(UnwindTable {
            arch: self.arch(),
            source: Source::SFrame {
                version: self.header.version,
            },
            functions,
        })
    }
}

/// Iterator over the FREs of one function.
#[derive(Clone, Debug)]
pub struct FreIter<'s, 'a> {
    section: &'s Section<'a>,
    fde: Fde,
    next: u32,
    off: usize,
}

impl Iterator for FreIter<'_, '_> {
    type Item = Fre;
    fn next(&mut self) -> Option<Fre> {
        if self.next >= self.fde.num_fres {
            return None;
        }
        let s = self.section;
        let fre = decode_fre(
            s.data,
            self.off,
            s.fres_end,
            self.fde.fre_type,
            self.fde.addr_size(),
            s.header.endian,
            self.next,
        )
        .ok()?;
        self.next += 1;
        self.off += fre.len;
        Some(fre)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.fde.num_fres - self.next.min(self.fde.num_fres)) as usize;
        (0, Some(n))
    }
}
