//! The SFrame header and format constants (binutils `include/sframe.h`).

use sframe_common::dwarf::{self, DwarfRegs};

use super::error::SFrameError;

pub const MAGIC: u16 = 0xdee2;
/// Size of the fixed header (preamble included), before any auxiliary header.
pub const HEADER_SIZE: usize = 28;

pub const F_FDE_SORTED: u8 = 0x1;
pub const F_FRAME_POINTER: u8 = 0x2;
pub const F_FDE_FUNC_START_PCREL: u8 = 0x4;
/// Every flag some version defines.
pub const KNOWN_FLAGS: u8 = F_FDE_SORTED | F_FRAME_POINTER | F_FDE_FUNC_START_PCREL;

pub const ABI_AARCH64_BE: u8 = 1;
pub const ABI_AARCH64_LE: u8 = 2;
pub const ABI_AMD64_LE: u8 = 3;
pub const ABI_S390X_BE: u8 = 4;

/// Size of one FDE (v3: FDE index entry) per version.
pub const FDE_SIZE_V1: usize = 17;
pub const FDE_SIZE_V2: usize = 20;
pub const FDE_SIZE_V3: usize = 16;
/// Size of the v3 function descriptor attribute record before each function's FREs.
pub const FDE_ATTR_SIZE_V3: usize = 5;

/// s390x stores CFA offsets as `(off - 160) / 8`.
pub const S390X_CFA_OFFSET_ADJUSTMENT: i32 = -160;
pub const S390X_CFA_OFFSET_ALIGNMENT_FACTOR: i32 = 8;

/// The ABI/arch identifier of a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Abi {
    Aarch64BigEndian,
    Aarch64LittleEndian,
    Amd64LittleEndian,
    S390xBigEndian,
}

impl Abi {
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            ABI_AARCH64_BE => Abi::Aarch64BigEndian,
            ABI_AARCH64_LE => Abi::Aarch64LittleEndian,
            ABI_AMD64_LE => Abi::Amd64LittleEndian,
            ABI_S390X_BE => Abi::S390xBigEndian,
            _ => return None,
        })
    }
    pub fn code(self) -> u8 {
        match self {
            Abi::Aarch64BigEndian => ABI_AARCH64_BE,
            Abi::Aarch64LittleEndian => ABI_AARCH64_LE,
            Abi::Amd64LittleEndian => ABI_AMD64_LE,
            Abi::S390xBigEndian => ABI_S390X_BE,
        }
    }
    pub fn is_big_endian(self) -> bool {
        matches!(self, Abi::Aarch64BigEndian | Abi::S390xBigEndian)
    }
    pub fn is_aarch64(self) -> bool {
        matches!(self, Abi::Aarch64BigEndian | Abi::Aarch64LittleEndian)
    }
    /// DWARF numbers of the stack pointer and frame pointer.
    pub fn sp_fp_dwarf(self) -> (u16, u16) {
        self.dwarf_regs().sp_fp()
    }
    /// The architecture's DWARF register numbers.
    pub fn dwarf_regs(self) -> &'static DwarfRegs {
        match self {
            Abi::Amd64LittleEndian => &dwarf::AMD64,
            Abi::Aarch64BigEndian | Abi::Aarch64LittleEndian => &dwarf::AARCH64,
            Abi::S390xBigEndian => &dwarf::S390X,
        }
    }
}

/// Byte order of the section's multi-byte fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endian {
    Little,
    Big,
}

impl Endian {
    pub fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        }
    }
    pub fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }
    pub fn u64(self, b: [u8; 8]) -> u64 {
        match self {
            Endian::Little => u64::from_le_bytes(b),
            Endian::Big => u64::from_be_bytes(b),
        }
    }
    pub fn put_u16(self, v: u16) -> [u8; 2] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
    pub fn put_u32(self, v: u32) -> [u8; 4] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
    pub fn put_u64(self, v: u64) -> [u8; 8] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
}

/// Bounds-checked fixed-size read; `None` when out of range.
pub(crate) fn bytes<const N: usize>(data: &[u8], off: usize) -> Option<[u8; N]> {
    let end = off.checked_add(N)?;
    data.get(off..end)?.try_into().ok()
}

/// The decoded SFrame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub flags: u8,
    pub abi: Abi,
    pub endian: Endian,
    pub cfa_fixed_fp_offset: i8,
    pub cfa_fixed_ra_offset: i8,
    pub auxhdr_len: u8,
    pub num_fdes: u32,
    pub num_fres: u32,
    pub fre_len: u32,
    pub fdeoff: u32,
    pub freoff: u32,
}

impl Header {
    /// Size of the header including the auxiliary header.
    pub fn size(&self) -> usize {
        HEADER_SIZE + usize::from(self.auxhdr_len)
    }
    pub fn fde_size(&self) -> usize {
        match self.version {
            1 => FDE_SIZE_V1,
            2 => FDE_SIZE_V2,
            _ => FDE_SIZE_V3,
        }
    }
    /// Most data words a DEFAULT (non-FLEX) row may carry: the CFA offset, then the RA
    /// offset unless the header fixes it, then the FP offset unless the header fixes it
    /// (a word for a fixed offset would be ignored: libsframe returns the fixed one, the
    /// kernel's reader rejects the word as leftover, and so does this reader).
    pub fn max_default_words(&self) -> usize {
        3 - usize::from(self.cfa_fixed_ra_offset != 0) - usize::from(self.cfa_fixed_fp_offset != 0)
    }
    pub fn sorted(&self) -> bool {
        self.flags & F_FDE_SORTED != 0
    }
    pub fn pcrel(&self) -> bool {
        self.flags & F_FDE_FUNC_START_PCREL != 0
    }

    /// Parse and check the header: magic (either byte order), version, flags, ABI.
    pub fn parse(data: &[u8]) -> Result<Self, SFrameError> {
        let Some(pre) = bytes::<HEADER_SIZE>(data, 0) else {
            return Err(SFrameError::TruncatedHeader {
                len: data.len(),
                need: HEADER_SIZE,
            });
        };
        let magic_le = u16::from_le_bytes([pre[0], pre[1]]);
        let endian = if magic_le == MAGIC {
            Endian::Little
        } else if magic_le.swap_bytes() == MAGIC {
            Endian::Big
        } else {
            return Err(SFrameError::BadMagic { magic: magic_le });
        };
        let version = pre[2];
        let flags = pre[3];
        let allowed = match version {
            1 => F_FDE_SORTED | F_FRAME_POINTER,
            2 => F_FDE_SORTED | F_FRAME_POINTER | F_FDE_FUNC_START_PCREL,
            3 => F_FDE_SORTED | F_FDE_FUNC_START_PCREL,
            _ => return Err(SFrameError::UnsupportedVersion { version }),
        };
        if flags & !KNOWN_FLAGS != 0 {
            return Err(SFrameError::UnknownFlags { flags, version });
        }
        let foreign = flags & !allowed;
        if foreign != 0 {
            // The lowest such bit (there are at most two).
            return Err(SFrameError::FlagNotInVersion {
                flag: foreign & foreign.wrapping_neg(),
                version,
            });
        }
        let abi = Abi::from_code(pre[4]).ok_or(SFrameError::UnknownAbi { abi: pre[4] })?;
        if abi.is_big_endian() != (endian == Endian::Big) {
            return Err(SFrameError::AbiEndianMismatch { abi: pre[4] });
        }
        // (Constant offsets inside the fixed-size preamble.)
        #[allow(clippy::indexing_slicing)]
        let w = |o: usize| endian.u32([pre[o], pre[o + 1], pre[o + 2], pre[o + 3]]);
        let h = Header {
            version,
            flags,
            abi,
            endian,
            cfa_fixed_fp_offset: pre[5] as i8,
            cfa_fixed_ra_offset: pre[6] as i8,
            auxhdr_len: pre[7],
            num_fdes: w(8),
            num_fres: w(12),
            fre_len: w(16),
            fdeoff: w(20),
            freoff: w(24),
        };
        if data.len() < h.size() {
            return Err(SFrameError::SubsectionOutOfBounds {
                which: super::error::Subsection::AuxHeader,
                start: HEADER_SIZE as u64,
                len: u64::from(h.auxhdr_len),
                section_len: data.len(),
            });
        }
        Ok(h)
    }
}
