//! Zero-copy reader: [`Section`] over the section bytes, validated once at open.
//!
//! `Section::parse` walks every FDE and FRE once and checks the whole section (see
//! [`SFrameError`] for the list of checks); afterwards the iterators and lookups cannot
//! fail. The hot loops live in the `scan` module; the careful decoders here name the
//! failed check and are run only on the FDE that failed (and by
//! [`Section::parse_reference`], the slow reference the tests compare against).
//! Allocations, all at open and bounded by counts already checked against the section
//! size: a private sort index, only when the section does not carry
//! `SFRAME_F_FDE_SORTED`, and lookup checkpoints for functions with more than
//! `CHECKPOINT_STEP` FREs (16 bytes per that many FREs). Iteration allocates nothing.

use sframe_common::{CfaBase, CfaRule, RegRule, RuleFlags, UnwindRule};

use super::error::{FlexProblem, SFrameError, Subsection};
use super::header::{
    Abi, Endian, FDE_ATTR_SIZE_V3, Header, S390X_CFA_OFFSET_ADJUSTMENT,
    S390X_CFA_OFFSET_ALIGNMENT_FACTOR, bytes,
};
use super::scan::{self, CHECKPOINT_STEP, Checkpoint, FdeFormat, FreChecks};
use crate::table::{Arch, PcType, Row, Source, TableBuilder, UnwindTable};

/// Offsets of the header's count fields, named by the errors about them.
pub const HDR_NUM_FDES: usize = 8;
/// Offset of `sfh_num_fres`.
pub const HDR_NUM_FRES: usize = 12;
/// Offset of `sfh_fre_len`.
pub const HDR_FRE_LEN: usize = 16;

/// The maximum number of data words an FRE info byte can announce (4-bit field).
pub const MAX_WORDS: usize = 15;

/// Most functions (FDEs) a section may have: 26× the largest object seen (libLLVM,
/// 160,806). A section claiming more is refused before anything is read or allocated
/// for them; the unwinder could not hold its table anyway.
pub const MAX_FUNCTIONS: u32 = 1 << 22;

/// Most rows (FREs) a section may have (12× libLLVM's 1.3 million; the kernel maps
/// hold 4 million in all).
pub const MAX_SECTION_ROWS: u32 = 1 << 24;

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
    /// Function size in bytes (`sfde_func_size`).
    pub size: u32,
    /// Number of FREs of the function (`sfde_func_num_fres`; v3: in the attribute record).
    pub num_fres: u32,
    /// FRE start-address width code (0: 1 byte, 1: 2 bytes, 2: 4 bytes).
    pub fre_type: u8,
    /// How the rows match a PC: the FDE type, PCINC or PCMASK (bit 4 of the info byte).
    pub pc_type: PcType,
    /// The raw info byte(s) and rep_size as stored.
    pub info: u8,
    /// v3: the attribute record's info2 byte (FDE type in bits 0..=4); 0 in v1 and v2.
    pub info2: u8,
    /// `sfde_func_rep_size` as stored: the block size in bytes of a PCMASK function (0 in v1,
    /// which has no such field; see `pc_type`).
    pub rep_size: u8,
    /// AArch64: signed return addresses use key B (bit 5 of the info byte), else key A.
    pub pauth_key_b: bool,
    /// v3: the function is a signal trampoline (bit 7 of the info byte).
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

/// One frame row entry, decoded but not interpreted. Its data words stay in the
/// section's bytes (no copy) and are read on demand by [`Fre::uword`] / [`Fre::iword`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fre<'a> {
    /// Index within its function.
    pub index: u32,
    /// Byte offset of the FRE in the section.
    pub offset: usize,
    /// Start offset relative to the function start (a mask offset for PCMASK).
    pub start_offset: u32,
    /// The FRE's info byte (`sfre_info`): CFA base register, data word count and size,
    /// mangled-RA bit.
    pub info: u8,
    /// Encoded length in bytes.
    pub len: usize,
    /// The data words as stored: `count()` words of `word_size()` bytes.
    words: &'a [u8],
    big_endian: bool,
}

impl<'a> Fre<'a> {
    /// An FRE whose `words` hold exactly `count()` words of `word_size()` bytes.
    #[inline]
    pub(super) fn new(
        index: u32,
        offset: usize,
        start_offset: u32,
        info: u8,
        words: &'a [u8],
        big_endian: bool,
        len: usize,
    ) -> Self {
        Fre {
            index,
            offset,
            start_offset,
            info,
            len,
            words,
            big_endian,
        }
    }
    /// Data word count (0 means "RA undefined": outermost frame).
    #[inline]
    pub fn count(&self) -> usize {
        usize::from((self.info >> 1) & 0xf)
    }
    /// Data word size code (0/1/2 valid).
    #[inline]
    pub fn size_code(&self) -> u8 {
        (self.info >> 5) & 0x3
    }
    /// Data word size in bytes (1, 2 or 4).
    #[inline]
    pub fn word_size(&self) -> usize {
        match self.size_code() {
            0 => 1,
            1 => 2,
            _ => 4,
        }
    }
    /// CFA base register bit: true for SP, false for FP.
    #[inline]
    pub fn base_is_sp(&self) -> bool {
        self.info & 1 != 0
    }
    /// Whether the RA is signed (bit 7 of the info byte; AArch64 pointer authentication).
    #[inline]
    pub fn mangled_ra(&self) -> bool {
        self.info & 0x80 != 0
    }
    /// The data words' bytes as stored in the section.
    pub fn word_bytes(&self) -> &'a [u8] {
        self.words
    }
    /// Word `i` as unsigned (FLEX control words).
    #[inline]
    pub fn uword(&self, i: usize) -> Option<u32> {
        if i >= self.count() {
            return None;
        }
        let be = self.big_endian;
        Some(match self.size_code() {
            0 => u32::from(*self.words.get(i)?),
            1 => {
                let b: [u8; 2] = self.words.get(2 * i..2 * i + 2)?.try_into().ok()?;
                u32::from(if be {
                    u16::from_be_bytes(b)
                } else {
                    u16::from_le_bytes(b)
                })
            }
            _ => {
                let b: [u8; 4] = self.words.get(4 * i..4 * i + 4)?.try_into().ok()?;
                if be {
                    u32::from_be_bytes(b)
                } else {
                    u32::from_le_bytes(b)
                }
            }
        })
    }
    /// Words 0, 1 and 2 sign-extended from their width, `None` past `count()`.
    #[inline(always)]
    pub fn first_words(&self) -> [Option<i32>; 3] {
        let w = self.words;
        let be = self.big_endian;
        match self.size_code() {
            0 => [0, 1, 2].map(|i| w.get(i).map(|&b| i32::from(b as i8))),
            1 => [0, 2, 4].map(|i| {
                let b = [*w.get(i)?, *w.get(i + 1)?];
                Some(i32::from(if be {
                    i16::from_be_bytes(b)
                } else {
                    i16::from_le_bytes(b)
                }))
            }),
            _ => [0, 4, 8].map(|i| {
                let b: [u8; 4] = w.get(i..i + 4)?.try_into().ok()?;
                Some(if be {
                    i32::from_be_bytes(b)
                } else {
                    i32::from_le_bytes(b)
                })
            }),
        }
    }
    /// Word `i` sign-extended from its width (offsets).
    #[inline]
    pub fn iword(&self, i: usize) -> Option<i32> {
        let w = self.uword(i)?;
        Some(match self.size_code() {
            0 => i32::from(w as u8 as i8),
            1 => i32::from(w as u16 as i16),
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
    /// `data[..fres_end]`: every FRE read is bounded by it.
    fre_area: &'a [u8],
    fmt: FdeFormat,
    big_endian: bool,
    /// FDE indices in address order, only when the section is not SORTED.
    sorted_index: Option<Vec<u32>>,
    /// Lookup checkpoints of functions with many FREs, by (FDE index, FRE index).
    checkpoints: Vec<Checkpoint>,
    /// The fast FDE search's index, when the section is simple (see
    /// [`Section::find_fde`]).
    addr_index: Option<AddrIndex>,
}

/// Function starts in address order, bucketed by address: `counts[b]` is the number of
/// functions that start before `base + (b << shift)`, so the functions starting at or
/// before an address in bucket `b` number between `counts[b]` and `counts[b + 1]`.
/// There are at most twice as many buckets as functions (`shift` is chosen so): 8
/// bytes per function at most, and about one function per bucket.
#[derive(Clone, Debug)]
pub(super) struct AddrIndex {
    pub base: i64,
    pub shift: u32,
    pub counts: Vec<u32>,
}

/// Tracks, over FDEs in address order, whether starts strictly increase and functions
/// do not overlap ("simple"), and the address range they span.
#[derive(Default)]
struct OrderCheck {
    /// Start and end of the previous function.
    prev: Option<(i64, i128)>,
    first: Option<i64>,
    simple: bool,
}

impl OrderCheck {
    fn new() -> Self {
        Self {
            simple: true,
            ..Self::default()
        }
    }
    #[inline]
    fn push(&mut self, rel_start: i64, size: u32) {
        let start = i128::from(rel_start);
        if self
            .prev
            .is_some_and(|(prev_start, prev_end)| rel_start <= prev_start || start < prev_end)
        {
            self.simple = false;
        }
        self.first.get_or_insert(rel_start);
        self.prev = Some((rel_start, start + i128::from(size)));
    }
}

/// The section-wide state of the fast validation pass.
#[derive(Default)]
struct Walk {
    sorted: bool,
    attr_size: usize,
    total_fres: u64,
    used: u64,
    prev_start: i64,
    unsorted: bool,
    order: OrderCheck,
    /// End of the last FRE data range, while the ranges come in order.
    prev_end: usize,
    out_of_order: bool,
    /// The address index, counted during the pass when the first and last FDEs say
    /// what range the functions span (checked at the end).
    index: Option<IndexFill>,
}

/// An [`AddrIndex`] being counted in the validation pass, for functions expected to
/// span `[base, end)` in on-disk order.
struct IndexFill {
    base: i64,
    end: i128,
    shift: u32,
    counts: Vec<u32>,
    /// Every start fell in a bucket.
    ok: bool,
}

impl IndexFill {
    /// The shift giving at most 2n buckets over `[base, end)`, and its bucket count.
    fn shape(base: i64, end: i128, n: u32) -> (u32, usize) {
        let span = (end - i128::from(base)).max(0) as u128;
        let n = u128::from(n.max(1));
        let mut shift = 0u32;
        while shift < 127 && (span >> shift) >= 2 * n {
            shift += 1;
        }
        (shift, (span >> shift) as usize + 1)
    }

    fn new(base: i64, end: i128, n: u32) -> Self {
        let (shift, buckets) = Self::shape(base, end, n);
        Self {
            base,
            end,
            shift,
            counts: vec![0u32; buckets + 1],
            ok: true,
        }
    }

    #[inline(always)]
    fn add(&mut self, start: i64) {
        let d = i128::from(start) - i128::from(self.base);
        let b = if d < 0 {
            usize::MAX
        } else {
            ((d as u128) >> self.shift) as usize
        };
        match self.counts.get_mut(b.wrapping_add(1)) {
            Some(c) => *c += 1,
            None => self.ok = false,
        }
    }

    /// The index, when the functions did span `[base, end)` as expected.
    fn finish(self, first: i64, end: i128) -> Option<AddrIndex> {
        (self.ok && first == self.base && end == self.end).then(|| self.into_index())
    }

    /// The index of the starts added (prefix sums of the bucket counts).
    fn into_index(mut self) -> AddrIndex {
        let mut sum = 0;
        for c in &mut self.counts {
            sum += *c;
            *c = sum;
        }
        AddrIndex {
            base: self.base,
            shift: self.shift,
            counts: self.counts,
        }
    }
}

impl Walk {
    /// Bookkeeping of one function (in on-disk order) whose FREs end at `end`; false
    /// when the FDEs are out of order in a SORTED section.
    #[inline(always)]
    fn function(&mut self, fde: &Fde, end: usize) -> bool {
        if fde.rel_start < self.prev_start {
            if self.sorted {
                return false;
            }
            self.unsorted = true;
        }
        self.prev_start = fde.rel_start;
        self.order.push(fde.rel_start, fde.size);
        if let Some(fill) = &mut self.index {
            fill.add(fde.rel_start);
        }
        let data_start = fde.fres_offset - self.attr_size;
        self.total_fres += u64::from(fde.num_fres);
        self.used += (end - data_start) as u64;
        if end > data_start && !self.out_of_order {
            if data_start >= self.prev_end {
                self.prev_end = end;
            } else {
                self.out_of_order = true;
            }
        }
        true
    }
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
) -> Result<Fre<'_>, bool> {
    let limit = data.get(..end).ok_or(true)?;
    let start_offset = read_start_addr(limit, off, fre_type, e).ok_or(true)?;
    let info_off = off.checked_add(addr_size).ok_or(true)?;
    let info = *limit.get(info_off).ok_or(true)?;
    let code = (info >> 5) & 3;
    if code == 3 {
        return Err(false);
    }
    let ws = 1usize << code;
    let count = usize::from((info >> 1) & 0xf);
    let p = info_off + 1;
    let words = limit.get(p..p + count * ws).ok_or(true)?;
    Ok(Fre::new(
        index,
        off,
        start_offset,
        info,
        words,
        e == Endian::Big,
        p + count * ws - off,
    ))
}

impl<'a> Section<'a> {
    /// Header and sub-section checks; the FDEs and FREs are not looked at yet.
    fn open(data: &'a [u8], section_vaddr: u64) -> Result<Self, SFrameError> {
        let header = Header::parse(data)?;
        let hsize = header.size();
        let len = data.len();
        for (what, count, limit, offset) in [
            ("FDEs", header.num_fdes, MAX_FUNCTIONS, HDR_NUM_FDES),
            ("FREs", header.num_fres, MAX_SECTION_ROWS, HDR_NUM_FRES),
        ] {
            if count > limit {
                return Err(SFrameError::LimitExceeded {
                    what,
                    count,
                    limit,
                    offset,
                });
            }
        }
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
        let section = Section {
            data,
            vaddr: section_vaddr,
            header,
            fdes_start,
            fres_start,
            fres_end,
            fre_area: data.get(..fres_end).unwrap_or_default(),
            fmt: FdeFormat {
                version: header.version,
                pcrel: header.pcrel(),
                aarch64: header.abi.is_aarch64(),
                abi: header.abi.code(),
                fdes_start,
                fres_start,
                vaddr: section_vaddr,
            },
            big_endian: header.endian == Endian::Big,
            sorted_index: None,
            checkpoints: Vec::new(),
            addr_index: None,
        };
        Ok(section)
    }

    /// Parse and fully validate the bytes of an `.sframe` section loaded at `section_vaddr`.
    pub fn parse(data: &'a [u8], section_vaddr: u64) -> Result<Self, SFrameError> {
        let mut section = Self::open(data, section_vaddr)?;
        section.validate()?;
        Ok(section)
    }

    /// [`Section::parse`] through the careful per-field decoders only, without the
    /// specialized loops or lookup checkpoints: the reference that tests and fuzzing
    /// compare the fast path with. Same result, same errors, slower.
    #[doc(hidden)]
    pub fn parse_reference(data: &'a [u8], section_vaddr: u64) -> Result<Self, SFrameError> {
        let mut section = Self::open(data, section_vaddr)?;
        section.validate_reference()?;
        Ok(section)
    }

    /// The FDE of a validated section (fast decoder).
    #[inline(always)]
    fn fde_valid(&self, index: u32) -> Option<Fde> {
        scan::fde(&self.fmt, self.big_endian, self.data, self.fre_area, index)
    }

    /// FDE `index` through the careful decoder (tests compare it with [`Section::fde`]).
    #[doc(hidden)]
    pub fn fde_reference(&self, index: u32) -> Result<Fde, SFrameError> {
        self.decode_fde(index)
    }

    /// The FREs of `fde` through the careful decoder (tests compare them with
    /// [`Section::rows`]); stops at the first one that does not decode.
    #[doc(hidden)]
    pub fn rows_reference(&self, fde: &Fde) -> Vec<Fre<'a>> {
        let mut out = Vec::new();
        let mut off = fde.fres_offset;
        for j in 0..fde.num_fres {
            let Ok(fre) = decode_fre(
                self.data,
                off,
                self.fres_end,
                fde.fre_type,
                fde.addr_size(),
                self.header.endian,
                j,
            ) else {
                break;
            };
            off += fre.len;
            out.push(fre);
        }
        out
    }

    /// The index of the fast FDE search (`None`: the libsframe search is used).
    pub(super) fn addr_index(&self) -> Option<&AddrIndex> {
        self.addr_index.as_ref()
    }

    /// Lookup checkpoints (tests).
    #[doc(hidden)]
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.len()
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
        crate::ehframe::count_parse();
        let file = object::File::parse(elf).map_err(|_| SFrameError::Elf {
            what: "not a readable ELF file",
        })?;
        Section::from_elf(&file)
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// The SFrame version (1, 2 or 3).
    pub fn version(&self) -> u8 {
        self.header.version
    }
    /// The section's ABI/arch.
    pub fn abi(&self) -> Abi {
        self.header.abi
    }
    /// The virtual address the section is loaded at, as given at open.
    pub fn section_vaddr(&self) -> u64 {
        self.vaddr
    }
    /// The section's bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
    /// Number of FDEs (functions).
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
            let attr_oob = SFrameError::FdeAttrOutOfBounds {
                fde: index,
                offset: off,
                attr,
            };
            if attr + FDE_ATTR_SIZE_V3 as u64 > self.fres_end as u64 {
                return Err(attr_oob);
            }
            let a = attr as usize;
            let b = bytes::<5>(d, a).ok_or(attr_oob)?;
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
                return Err(SFrameError::FreOffsetOutOfBounds {
                    fde: index,
                    offset: off,
                    fres: fre_data,
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
                return Err(SFrameError::FdeInfo2ReservedBits {
                    fde: index,
                    // The attribute record: num_fres (2 bytes), info, info2, rep_size.
                    offset: fres_offset - FDE_ATTR_SIZE_V3 + 3,
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

    /// Walk every FDE and FRE once and apply all checks with the specialized decoders
    /// of [`scan`], which only say pass or fail. When they fail (malformed input), the
    /// careful pass runs from the start and names the first failed check, FDE, FRE and
    /// offset, exactly as it always has.
    fn validate(&mut self) -> Result<(), SFrameError> {
        let ok = match (self.header.version == 3, self.big_endian) {
            (true, false) => self.validate_fast::<true, false>(),
            (true, true) => self.validate_fast::<true, true>(),
            (false, false) => self.validate_fast::<false, false>(),
            (false, true) => self.validate_fast::<false, true>(),
        };
        if ok {
            return Ok(());
        }
        self.sorted_index = None;
        self.checkpoints = Vec::new();
        self.addr_index = None;
        self.validate_reference()
    }

    /// The checks of [`Section::validate_reference`], pass or fail, in one pass over
    /// the FDEs; FREs of pairs of small functions are checked together (two independent
    /// chains of FRE lengths, which the CPU overlaps). Also builds the lookup index and
    /// checkpoints, and the sort index of an unsorted section.
    fn validate_fast<const V3: bool, const BE: bool>(&mut self) -> bool {
        let h = self.header;
        let (data, area) = (self.data, self.fre_area);
        let base_checks = FreChecks {
            size: 0,
            max_words: h.max_default_words() as u32,
            mangled_ok: h.abi.is_aarch64(),
            empty_ok: h.version != 1,
        };
        let checks = |f: &Fde| FreChecks {
            size: f.size,
            ..base_checks
        };
        let attr_size = if V3 { FDE_ATTR_SIZE_V3 } else { 0 };
        // The first and last FDEs' starts say the range a simple section spans: the
        // address index is then counted in this pass (the end confirms the guess).
        let n = h.num_fdes;
        let index = match (
            self.fde_start_size(0),
            n.checked_sub(1).and_then(|l| self.fde_start_size(l)),
        ) {
            (Some((first, _)), Some((last, size))) if last >= first => Some(IndexFill::new(
                first,
                i128::from(last) + i128::from(size),
                n,
            )),
            _ => None,
        };
        let mut w = Walk {
            sorted: h.sorted(),
            attr_size,
            prev_start: i64::MIN,
            order: OrderCheck::new(),
            index,
            ..Walk::default()
        };
        let mut checkpoints = Vec::new();
        // Functions whose FREs can be checked in a pair: no checkpoints, not FLEX.
        let pairable = |f: &Fde| !f.flex && f.num_fres <= CHECKPOINT_STEP;
        let mut i = 0;
        while i < n {
            let Some(a) = scan::fde_g::<V3, BE>(&self.fmt, data, area, i) else {
                return false;
            };
            if pairable(&a) && i + 1 < n {
                let Some(b) = scan::fde_g::<V3, BE>(&self.fmt, data, area, i + 1) else {
                    return false;
                };
                if pairable(&b) {
                    let (ca, cb) = (checks(&a), checks(&b));
                    let Some((ea, eb)) = scan::scan_pair(
                        BE,
                        area,
                        (a.fres_offset, a.num_fres, &ca, a.fre_type),
                        (b.fres_offset, b.num_fres, &cb, b.fre_type),
                    ) else {
                        return false;
                    };
                    if !w.function(&a, ea) || !w.function(&b, eb) {
                        return false;
                    }
                    i += 2;
                    continue;
                }
            }
            let end = if a.flex {
                self.check_fres_careful(&a, &mut checkpoints).ok()
            } else {
                let cp = (a.num_fres > CHECKPOINT_STEP).then_some((
                    i,
                    self.fres_start,
                    &mut checkpoints,
                ));
                scan::scan_fres(
                    BE,
                    a.fre_type,
                    area,
                    a.fres_offset,
                    a.num_fres,
                    &checks(&a),
                    cp,
                )
            };
            let Some(end) = end else {
                return false;
            };
            if !w.function(&a, end) {
                return false;
            }
            i += 1;
        }
        if w.total_fres != u64::from(h.num_fres) || w.used != u64::from(h.fre_len) {
            return false;
        }
        if w.out_of_order && self.check_overlaps().is_err() {
            return false;
        }
        let mut order = w.order;
        let mut fill = w.index;
        if w.unsorted {
            self.build_sorted_index();
            order = OrderCheck::new();
            for (start, size) in self.starts_sorted() {
                order.push(start, size);
            }
            fill = None;
        }
        self.checkpoints = checkpoints;
        if let (true, Some(base), Some((_, end))) = (order.simple, order.first, order.prev) {
            self.addr_index = fill
                .and_then(|f| f.finish(base, end))
                .or_else(|| Some(self.build_addr_index(base, end)));
        }
        true
    }

    /// Start and size of every function in address order.
    fn starts_sorted(&self) -> impl Iterator<Item = (i64, u32)> + '_ {
        (0..self.header.num_fdes).map(|k| {
            self.sorted_to_disk(k)
                .and_then(|i| self.fde_start_size(i))
                .unwrap_or_default()
        })
    }

    /// The [`AddrIndex`] of a simple section whose functions span `[base, end)`.
    fn build_addr_index(&self, base: i64, end: i128) -> AddrIndex {
        let mut fill = IndexFill::new(base, end, self.header.num_fdes);
        for (start, _) in self.starts_sorted() {
            fill.add(start);
        }
        fill.into_index()
    }

    /// The FREs of one function through the careful decoder (FLEX functions), with
    /// their checkpoints; the offset after the last one.
    fn check_fres_careful(
        &self,
        fde: &Fde,
        checkpoints: &mut Vec<Checkpoint>,
    ) -> Result<usize, SFrameError> {
        let n = fde.num_fres;
        let mut off = fde.fres_offset;
        let mut prev: Option<u32> = None;
        for j in 0..n {
            let fre = self.check_fre(fde, j, off, prev)?;
            if n > CHECKPOINT_STEP && j % CHECKPOINT_STEP == 0 {
                checkpoints.push(Checkpoint {
                    fde: fde.index,
                    fre: j,
                    start: fre.start_offset,
                    rel_offset: u32::try_from(off - self.fres_start).unwrap_or(u32::MAX),
                });
            }
            prev = Some(fre.start_offset);
            off += fre.len;
        }
        Ok(off)
    }

    /// FRE data ranges of all functions, sorted: no two may overlap.
    fn check_overlaps(&self) -> Result<(), SFrameError> {
        let attr_size = if self.header.version == 3 {
            FDE_ATTR_SIZE_V3
        } else {
            0
        };
        let mut ranges = Vec::with_capacity(self.header.num_fdes as usize);
        for fde in self.functions() {
            let start = fde.fres_offset - attr_size;
            let end = self
                .rows(&fde)
                .last()
                .map_or(fde.fres_offset, |f| f.offset + f.len);
            if end > start {
                ranges.push((start, end, fde.index));
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
        Ok(())
    }

    fn build_sorted_index(&mut self) {
        let mut idx: Vec<(i64, u32)> = self.functions().map(|f| (f.rel_start, f.index)).collect();
        idx.sort_unstable();
        self.sorted_index = Some(idx.into_iter().map(|(_, i)| i).collect());
    }

    /// The checks of [`Section::validate`] with the careful decoders only.
    fn validate_reference(&mut self) -> Result<(), SFrameError> {
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
                offset: HDR_NUM_FRES,
            });
        }
        if used != u64::from(h.fre_len) {
            return Err(SFrameError::FreLenMismatch {
                header: h.fre_len,
                used,
                offset: HDR_FRE_LEN,
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
    ) -> Result<Fre<'a>, SFrameError> {
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
                // The FRE's length as far as its info byte (when in the section) says.
                let aw = fde.addr_size();
                let len = match self.data.get(off + aw) {
                    Some(&info) if (info >> 5) & 3 != 3 => {
                        aw + 1 + (usize::from((info >> 1) & 0xf) << ((info >> 5) & 3))
                    }
                    _ => aw + 1,
                };
                SFrameError::FreDataOutOfBounds {
                    fde: fde.index,
                    fre: j,
                    offset: off,
                    len: len as u64,
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
            let max = h.max_default_words();
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
    #[inline]
    pub fn functions(&self) -> FdeIter<'_, 'a> {
        FdeIter {
            section: self,
            next: 0,
        }
    }

    /// FDE `index` in on-disk order.
    #[inline]
    pub fn fde(&self, index: u32) -> Option<Fde> {
        if index < self.header.num_fdes {
            self.fde_valid(index)
        } else {
            None
        }
    }

    /// On-disk index of the `k`-th FDE in address order.
    #[inline]
    pub(super) fn sorted_to_disk(&self, k: u32) -> Option<u32> {
        match &self.sorted_index {
            Some(idx) => idx.get(k as usize).copied(),
            None => Some(k),
        }
    }

    /// Section-relative start and size of FDE `index` (on-disk order), for searches.
    #[inline]
    pub(super) fn fde_start_size(&self, index: u32) -> Option<(i64, u32)> {
        scan::fde_start_size(&self.fmt, self.big_endian, self.data, index)
    }

    /// The lookup checkpoints of FDE `index` (on-disk order), in FRE order.
    #[inline]
    pub(super) fn checkpoints_of(&self, index: u32) -> &[Checkpoint] {
        let cps = &self.checkpoints;
        let lo = cps.partition_point(|c| c.fde < index);
        let hi = cps.partition_point(|c| c.fde <= index);
        cps.get(lo..hi).unwrap_or_default()
    }

    pub(super) fn fres_start(&self) -> usize {
        self.fres_start
    }

    /// The `k`-th FDE in address order.
    #[inline]
    pub fn fde_sorted(&self, k: u32) -> Option<Fde> {
        match &self.sorted_index {
            Some(idx) => self.fde(*idx.get(k as usize)?),
            None => self.fde(k),
        }
    }

    /// All FDEs in address order.
    #[inline]
    pub fn functions_sorted(&self) -> impl Iterator<Item = Fde> + '_ {
        (0..self.header.num_fdes).filter_map(move |k| self.fde_sorted(k))
    }

    /// The rows (FREs) of a function.
    #[inline]
    pub fn rows<'s>(&'s self, fde: &Fde) -> FreIter<'s, 'a> {
        self.rows_from(fde, 0, fde.fres_offset)
    }

    /// The rows of a function from FRE `first`, encoded at byte `off`.
    #[inline]
    pub(super) fn rows_from<'s>(&'s self, fde: &Fde, first: u32, off: usize) -> FreIter<'s, 'a> {
        FreIter {
            area: self.fre_area,
            off,
            next: first,
            num_fres: fde.num_fres,
            fre_type: fde.fre_type,
            big_endian: self.big_endian,
            _section: core::marker::PhantomData,
        }
    }

    #[inline(always)]
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
        let reg = u16::try_from(reg).map_err(|_| FlexProblem::BadRegister)?;
        Ok(if reg == sp {
            CfaBase::Sp
        } else if reg == fp {
            CfaBase::Fp
        } else {
            CfaBase::Reg(reg)
        })
    }

    /// The normalized rule of a row. Infallible for rows of a validated section.
    #[inline(always)]
    pub fn rule(&self, fde: &Fde, fre: &Fre<'_>) -> UnwindRule {
        if !fde.flex && fre.count() != 0 {
            return self.default_rule(fde, fre);
        }
        self.other_rule(fde, fre)
    }

    /// [`Section::rule`] for FLEX and zero-word rows (kept out of line).
    #[inline(never)]
    fn other_rule(&self, fde: &Fde, fre: &Fre<'_>) -> UnwindRule {
        self.try_rule(fde, fre).unwrap_or(UnwindRule {
            cfa: CfaRule::sp(0),
            ra: RegRule::Undefined,
            fp: RegRule::Unchanged,
            flags: RuleFlags::default(),
        })
    }

    #[inline(always)]
    fn flags_and_base(fde: &Fde, fre: &Fre<'_>) -> (RuleFlags, CfaBase) {
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
        (flags, base)
    }

    /// The rule of a row with data words in a DEFAULT (non-FLEX) function. Inlined into
    /// the caller: a returned rule then stays in registers.
    #[inline(always)]
    fn default_rule(&self, fde: &Fde, fre: &Fre<'_>) -> UnwindRule {
        let h = &self.header;
        let (flags, base) = Self::flags_and_base(fde, fre);
        // Up to three signed words (CFA offset, then RA and/or FP offsets).
        let [w0, w1, w2] = fre.first_words();
        let cfa = CfaRule {
            base,
            offset: self.s390x_cfa(w0.unwrap_or(0)),
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
        let (ra, fp_word) = if h.cfa_fixed_ra_offset != 0 {
            (RegRule::AtCfa(i32::from(h.cfa_fixed_ra_offset)), w1)
        } else {
            let ra = match w1 {
                // SFRAME_FRE_RA_OFFSET_INVALID: padding, RA not saved.
                Some(0) | None => RegRule::Unchanged,
                Some(v) => decode(v),
            };
            (ra, w2)
        };
        let fp = if h.cfa_fixed_fp_offset != 0 {
            RegRule::AtCfa(i32::from(h.cfa_fixed_fp_offset))
        } else {
            fp_word.map_or(RegRule::Unchanged, decode)
        };
        UnwindRule { cfa, ra, fp, flags }
    }

    fn try_rule(&self, fde: &Fde, fre: &Fre<'_>) -> Result<UnwindRule, FlexProblem> {
        let h = &self.header;
        let (flags, base) = Self::flags_and_base(fde, fre);
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
        if !fde.flex {
            return Ok(self.default_rule(fde, fre));
        }
        let w = |i: usize| fre.iword(i).unwrap_or(0);
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
                    let reg = u16::try_from(c >> 3).map_err(|_| FlexProblem::BadRegister)?;
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
        let mut b = TableBuilder::new(
            self.arch(),
            Source::SFrame {
                version: self.header.version,
            },
        );
        // Counts checked against the section size at open.
        b.reserve(self.header.num_fdes as usize, self.header.num_fres as usize);
        for fde in self.functions_sorted() {
            let rows = self.rows(&fde).map(|fre| Row {
                start_offset: fre.start_offset,
                rule: Some(self.rule(&fde, &fre)),
            });
            b.push(fde.start, fde.size, fde.pc_type, rows);
        }
        if b.rows_over_rule_limit() > 0 {
            return Err(SFrameError::TooManyRules {
                limit: crate::table::MAX_TABLE_RULES as u32,
            });
        }
        Ok(b.finish())
    }
}

/// Iterator over the FDEs of a section in on-disk order ([`Section::functions`]).
#[derive(Clone, Debug)]
pub struct FdeIter<'s, 'a> {
    section: &'s Section<'a>,
    next: u32,
}

impl Iterator for FdeIter<'_, '_> {
    type Item = Fde;
    // Inlined into the caller's loop so that the `Fde` is built in place.
    #[inline(always)]
    fn next(&mut self) -> Option<Fde> {
        while self.next < self.section.header.num_fdes {
            let i = self.next;
            self.next += 1;
            // Every FDE of a validated section decodes.
            if let Some(f) = self.section.fde_valid(i) {
                return Some(f);
            }
        }
        None
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.section.header.num_fdes.saturating_sub(self.next) as usize;
        (0, Some(n))
    }
}

/// Iterator over the FREs of one function.
#[derive(Clone, Debug)]
pub struct FreIter<'s, 'a> {
    area: &'a [u8],
    off: usize,
    next: u32,
    num_fres: u32,
    fre_type: u8,
    big_endian: bool,
    _section: core::marker::PhantomData<&'s Section<'a>>,
}

impl<'a> Iterator for FreIter<'_, 'a> {
    type Item = Fre<'a>;
    // Small enough to inline into the caller's loop (the width and byte order are
    // tested per row, predictably): a returned `Fre` then stays in registers.
    #[inline(always)]
    fn next(&mut self) -> Option<Fre<'a>> {
        if self.next >= self.num_fres {
            return None;
        }
        let (area, off, i) = (self.area, self.off, self.next);
        let fre = match (self.big_endian, self.fre_type) {
            (false, 0) => fre_at::<false, 1>(area, off, i),
            (false, 1) => fre_at::<false, 2>(area, off, i),
            (false, _) => fre_at::<false, 4>(area, off, i),
            (true, 0) => fre_at::<true, 1>(area, off, i),
            (true, 1) => fre_at::<true, 2>(area, off, i),
            (true, _) => fre_at::<true, 4>(area, off, i),
        }?;
        self.next += 1;
        self.off = off + fre.len;
        Some(fre)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.num_fres - self.next.min(self.num_fres)) as usize;
        (0, Some(n))
    }
    // Internal iteration (`for_each`, `fold`, `sum`, ...): one loop per start-address
    // width and byte order, so the width is not tested per row.
    #[inline(always)]
    fn fold<B, F: FnMut(B, Fre<'a>) -> B>(self, init: B, f: F) -> B {
        match (self.big_endian, self.fre_type) {
            (false, 0) => self.fold_g::<false, 1, B, F>(init, f),
            (false, 1) => self.fold_g::<false, 2, B, F>(init, f),
            (false, _) => self.fold_g::<false, 4, B, F>(init, f),
            (true, 0) => self.fold_g::<true, 1, B, F>(init, f),
            (true, 1) => self.fold_g::<true, 2, B, F>(init, f),
            (true, _) => self.fold_g::<true, 4, B, F>(init, f),
        }
    }
}

/// The FRE at `off` of `area` (start-address width `AW`, byte order `BE`), FRE `index`
/// of its function; `None` when it is not inside `area` or its word size code is the
/// invalid 3 (never in a validated section). The one decoder of the row iterator.
#[inline(always)]
// `h` is `AW + 1` bytes long (checked by the `get`): the indexing cannot fail, and
// this hot loop keeps its measured shape.
#[allow(clippy::indexing_slicing)]
fn fre_at<const BE: bool, const AW: usize>(area: &[u8], off: usize, index: u32) -> Option<Fre<'_>> {
    let h = area.get(off..off + AW + 1)?;
    let start = match AW {
        1 => u32::from(h[0]),
        2 => {
            let b = [h[0], h[1]];
            u32::from(if BE {
                u16::from_be_bytes(b)
            } else {
                u16::from_le_bytes(b)
            })
        }
        _ => {
            let b = [h[0], h[1], h[2], h[3]];
            if BE {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        }
    };
    let info = h[AW];
    let code = (info >> 5) & 3;
    let len = AW + 1 + (usize::from((info >> 1) & 0xf) << code);
    // Words bounds-checked before the code test, and no overflow check on `off` (it
    // is inside `area`): this shape keeps the iterator's loops at ~3 ns a row; an early
    // return on the code doubled `fold`'s time.
    let words = area.get(off + AW + 1..off + len)?;
    (code != 3).then(|| Fre::new(index, off, start, info, words, BE, len))
}

impl<'a> FreIter<'_, 'a> {
    #[inline(always)]
    fn fold_g<const BE: bool, const AW: usize, B, F: FnMut(B, Fre<'a>) -> B>(
        self,
        init: B,
        mut f: F,
    ) -> B {
        let mut acc = init;
        let mut off = self.off;
        for index in self.next..self.num_fres {
            let Some(fre) = fre_at::<BE, AW>(self.area, off, index) else {
                break;
            };
            let len = fre.len;
            acc = f(acc, fre);
            off += len;
        }
        acc
    }
}
