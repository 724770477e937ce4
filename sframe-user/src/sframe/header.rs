//! The SFrame header and format constants (binutils `include/sframe.h`).

use sframe_common::dwarf::{self, DwarfRegs};

use super::error::SFrameError;

/// The SFrame magic number (`SFRAME_MAGIC`, the preamble's `sfp_magic`).
pub const MAGIC: u16 = 0xdee2;
/// Size of the fixed header (preamble included), before any auxiliary header.
pub const HEADER_SIZE: usize = 28;

/// `SFRAME_F_FDE_SORTED`: the FDEs are sorted by function start address.
pub const F_FDE_SORTED: u8 = 0x1;
/// `SFRAME_F_FRAME_POINTER`: all functions keep a frame pointer (v1 and v2 only).
pub const F_FRAME_POINTER: u8 = 0x2;
/// `SFRAME_F_FDE_FUNC_START_PCREL`: an FDE's `sfde_func_start_address` is relative to
/// that field itself, not to the section start (v2 and v3 only).
pub const F_FDE_FUNC_START_PCREL: u8 = 0x4;
/// Every flag some version defines.
pub const KNOWN_FLAGS: u8 = F_FDE_SORTED | F_FRAME_POINTER | F_FDE_FUNC_START_PCREL;

/// `SFRAME_ABI_AARCH64_ENDIAN_BIG`.
pub const ABI_AARCH64_BE: u8 = 1;
/// `SFRAME_ABI_AARCH64_ENDIAN_LITTLE`.
pub const ABI_AARCH64_LE: u8 = 2;
/// `SFRAME_ABI_AMD64_ENDIAN_LITTLE`.
pub const ABI_AMD64_LE: u8 = 3;
/// `SFRAME_ABI_S390X_ENDIAN_BIG`.
pub const ABI_S390X_BE: u8 = 4;

/// Size of one FDE (v3: FDE index entry) per version.
pub const FDE_SIZE_V1: usize = 17;
/// Size of one v2 FDE in bytes.
pub const FDE_SIZE_V2: usize = 20;
/// Size of one v3 FDE index entry in bytes.
pub const FDE_SIZE_V3: usize = 16;
/// Size of the v3 function descriptor attribute record before each function's FREs.
pub const FDE_ATTR_SIZE_V3: usize = 5;

/// s390x stores CFA offsets as `(off - 160) / 8`.
pub const S390X_CFA_OFFSET_ADJUSTMENT: i32 = -160;
/// s390x CFA offsets are stored divided by this (see [`S390X_CFA_OFFSET_ADJUSTMENT`]).
pub const S390X_CFA_OFFSET_ALIGNMENT_FACTOR: i32 = 8;

/// The ABI/arch identifier of a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Abi {
    /// AArch64, big-endian ([`ABI_AARCH64_BE`]).
    Aarch64BigEndian,
    /// AArch64, little-endian ([`ABI_AARCH64_LE`]).
    Aarch64LittleEndian,
    /// AMD64 (x86-64), little-endian ([`ABI_AMD64_LE`]).
    Amd64LittleEndian,
    /// s390x, big-endian ([`ABI_S390X_BE`]).
    S390xBigEndian,
}

impl Abi {
    /// The ABI of an `sfh_abi_arch` code; `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            ABI_AARCH64_BE => Abi::Aarch64BigEndian,
            ABI_AARCH64_LE => Abi::Aarch64LittleEndian,
            ABI_AMD64_LE => Abi::Amd64LittleEndian,
            ABI_S390X_BE => Abi::S390xBigEndian,
            _ => return None,
        })
    }
    /// The ABI's `sfh_abi_arch` code.
    pub fn code(self) -> u8 {
        match self {
            Abi::Aarch64BigEndian => ABI_AARCH64_BE,
            Abi::Aarch64LittleEndian => ABI_AARCH64_LE,
            Abi::Amd64LittleEndian => ABI_AMD64_LE,
            Abi::S390xBigEndian => ABI_S390X_BE,
        }
    }
    /// Whether sections of this ABI are big-endian.
    pub fn is_big_endian(self) -> bool {
        matches!(self, Abi::Aarch64BigEndian | Abi::S390xBigEndian)
    }
    /// Whether the ABI is AArch64 (either byte order).
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
    /// Little-endian.
    Little,
    /// Big-endian.
    Big,
}

impl Endian {
    /// Reads a `u16` stored in this byte order.
    pub fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        }
    }
    /// Reads a `u32` stored in this byte order.
    pub fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }
    /// Reads a `u64` stored in this byte order.
    pub fn u64(self, b: [u8; 8]) -> u64 {
        match self {
            Endian::Little => u64::from_le_bytes(b),
            Endian::Big => u64::from_be_bytes(b),
        }
    }
    /// The bytes of `v` in this byte order.
    pub fn put_u16(self, v: u16) -> [u8; 2] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
    /// The bytes of `v` in this byte order.
    pub fn put_u32(self, v: u32) -> [u8; 4] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
    /// The bytes of `v` in this byte order.
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
    /// `sfp_version`: 1, 2 or 3.
    pub version: u8,
    /// `sfp_flags`: `F_*` bits.
    pub flags: u8,
    /// `sfh_abi_arch`, decoded.
    pub abi: Abi,
    /// Byte order of the section's fields (the one the magic was found in).
    pub endian: Endian,
    /// `sfh_cfa_fixed_fp_offset`: the FP's fixed offset from the CFA (saved at
    /// `CFA + offset`), or 0 when rows carry it.
    pub cfa_fixed_fp_offset: i8,
    /// `sfh_cfa_fixed_ra_offset`: the RA's fixed offset from the CFA (saved at
    /// `CFA + offset`), or 0 when rows carry it.
    pub cfa_fixed_ra_offset: i8,
    /// `sfh_auxhdr_len`: bytes of auxiliary header after the fixed header.
    pub auxhdr_len: u8,
    /// `sfh_num_fdes`: number of FDEs.
    pub num_fdes: u32,
    /// `sfh_num_fres`: number of FREs, all functions together.
    pub num_fres: u32,
    /// `sfh_fre_len`: length of the FRE sub-section in bytes.
    pub fre_len: u32,
    /// `sfh_fdeoff`: offset of the FDE sub-section, in bytes from the end of the header
    /// (auxiliary header included).
    pub fdeoff: u32,
    /// `sfh_freoff`: offset of the FRE sub-section, in bytes from the end of the header
    /// (auxiliary header included).
    pub freoff: u32,
}

impl Header {
    /// Size of the header including the auxiliary header.
    pub fn size(&self) -> usize {
        HEADER_SIZE + usize::from(self.auxhdr_len)
    }
    /// Bytes per FDE (v3: per FDE index entry) in this version.
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
    /// Whether [`F_FDE_SORTED`] is set.
    pub fn sorted(&self) -> bool {
        self.flags & F_FDE_SORTED != 0
    }
    /// Whether [`F_FDE_FUNC_START_PCREL`] is set.
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
