//! Typed errors of the SFrame reader and writer.
//!
//! Every reader error names the check that failed and where: the FDE index and FRE index
//! (when the failure is inside a function) and the byte offset into the section. All
//! fields are `Copy` so errors can be matched on, stored and counted cheaply.

/// Which sub-section an out-of-bounds or overlap error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subsection {
    /// The auxiliary header that follows the fixed 28-byte header.
    AuxHeader,
    /// The function descriptor entries (FDE index in v3).
    Fdes,
    /// The frame row entries (with the v3 attribute records).
    Fres,
}

impl core::fmt::Display for Subsection {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Subsection::AuxHeader => "auxiliary header",
            Subsection::Fdes => "FDE sub-section",
            Subsection::Fres => "FRE sub-section",
        })
    }
}

/// What is wrong with a FLEX (v3) row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlexProblem {
    /// The CFA control word does not name a register (`reg_p` = 0), or is padding.
    CfaNotRegister,
    /// A control word is followed by no offset word.
    MissingOffset,
    /// Data words follow the last complete rule.
    Leftover,
    /// `reg + offset` (no dereference, offset ≠ 0) for RA or FP: no `RegRule` expresses it.
    RegPlusOffset,
    /// A control word has its reserved bit 2 set.
    ReservedBit,
    /// A control word names a DWARF register number above 65535.
    BadRegister,
}

impl core::fmt::Display for FlexProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            FlexProblem::CfaNotRegister => "the CFA control word names no register",
            FlexProblem::MissingOffset => "a control word has no offset word after it",
            FlexProblem::Leftover => "data words follow the last rule",
            FlexProblem::RegPlusOffset => {
                "RA/FP = register + offset (no dereference) is not a recovery rule"
            }
            FlexProblem::ReservedBit => "a control word has its reserved bit 2 set",
            FlexProblem::BadRegister => "a control word names a register number above 65535",
        })
    }
}

/// The name of a header flag bit, for messages.
fn flag_name(flag: &u8) -> &'static str {
    match *flag {
        super::header::F_FDE_SORTED => "SFRAME_F_FDE_SORTED",
        super::header::F_FRAME_POINTER => "SFRAME_F_FRAME_POINTER",
        super::header::F_FDE_FUNC_START_PCREL => "SFRAME_F_FDE_FUNC_START_PCREL",
        _ => "an unknown flag",
    }
}

/// An SFrame section failed to parse or validate.
///
/// Each message is one line: the check that failed, then where (FDE index, FRE index
/// and byte offset into the section, or the header field's offset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SFrameError {
    #[error("header check: section is {len} bytes, shorter than the {need}-byte header (offset 0)")]
    TruncatedHeader { len: usize, need: usize },
    #[error("magic check: {magic:#06x} at offset 0 is neither 0xdee2 nor byte-swapped 0xdee2")]
    BadMagic { magic: u16 },
    #[error("version check: unsupported SFrame version {version} at offset 2")]
    UnsupportedVersion { version: u8 },
    /// Flag bits no SFrame version defines.
    #[error(
        "flags check: flags {flags:#04x} at offset 3 have unknown bits {:#04x} (version {version})",
        .flags & !super::header::KNOWN_FLAGS
    )]
    UnknownFlags { flags: u8, version: u8 },
    /// A flag defined by other versions only (`SFRAME_F_FRAME_POINTER` in v3,
    /// `SFRAME_F_FDE_FUNC_START_PCREL` in v1).
    #[error(
        "flags check: {} ({flag:#04x}) in the flags at offset 3 is not valid in SFrame version {version}",
        flag_name(.flag)
    )]
    FlagNotInVersion { flag: u8, version: u8 },
    #[error("ABI check: unknown ABI/arch {abi} at offset 4")]
    UnknownAbi { abi: u8 },
    #[error("ABI check: ABI/arch {abi} at offset 4 does not match the section's byte order")]
    AbiEndianMismatch { abi: u8 },
    #[error(
        "bounds check: {which} [{start}, {start}+{len}) is outside the {section_len}-byte section"
    )]
    SubsectionOutOfBounds {
        which: Subsection,
        start: u64,
        len: u64,
        section_len: usize,
    },
    #[error(
        "limit check: the header field at offset {offset} announces {count} {what}, more than the reader's limit of {limit}"
    )]
    LimitExceeded {
        what: &'static str,
        count: u32,
        limit: u32,
        /// Offset of the header field (8: FDE count, 12: FRE count).
        offset: usize,
    },
    #[error(
        "table limit check: the rows have more than {limit} distinct rules, more than one table holds"
    )]
    TooManyRules { limit: u32 },
    #[error(
        "layout check: FDE offset {fdeoff} is after FRE offset {freoff} (header offsets 20/24)"
    )]
    SubsectionOrder { fdeoff: u32, freoff: u32 },
    #[error(
        "count check: {num_fdes} FDEs of {fde_size} bytes do not fill the {space}-byte FDE sub-section at offset {offset}"
    )]
    FdeCountMismatch {
        num_fdes: u32,
        fde_size: u32,
        space: u64,
        offset: usize,
    },
    #[error(
        "count check: the header's FRE count at offset {offset} is {header}, the FDEs describe {found}"
    )]
    FreCountMismatch {
        header: u32,
        found: u64,
        /// Offset of the header field (`sfh_num_fres`: 12).
        offset: usize,
    },
    #[error(
        "length check: the header's FRE sub-section length at offset {offset} is {header} bytes, the FDEs use {used}"
    )]
    FreLenMismatch {
        header: u32,
        used: u64,
        /// Offset of the header field (`sfh_fre_len`: 16).
        offset: usize,
    },
    #[error("trailing data check: non-zero byte after the FRE sub-section at offset {offset}")]
    TrailingData { offset: usize },
    #[error("start address check: FDE {fde} at offset {offset}: function start address overflows")]
    FunctionStartOverflow { fde: u32, offset: usize },
    #[error("FRE type check: FDE {fde} at offset {offset}: address width code {code} is invalid")]
    InvalidFreType { fde: u32, offset: usize, code: u8 },
    #[error("FDE type check: FDE {fde} at offset {offset}: FDE type {code} (info2) is invalid")]
    InvalidFdeType { fde: u32, offset: usize, code: u8 },
    /// Reserved bits of the info byte, or the AArch64 pointer-authentication key bit on
    /// another ABI.
    #[error(
        "reserved bits check: FDE {fde} at offset {offset}: info byte {value:#04x} has reserved bits set"
    )]
    FdeReservedBits { fde: u32, offset: usize, value: u8 },
    /// Reserved bits (7..5) of a v3 attribute record's info2 byte; `offset` is the
    /// info2 byte's.
    #[error(
        "reserved bits check: FDE {fde}: info2 byte {value:#04x} at offset {offset} has reserved bits set"
    )]
    FdeInfo2ReservedBits { fde: u32, offset: usize, value: u8 },
    #[error("rep_size check: FDE {fde} at offset {offset}: PCMASK function with rep_size 0")]
    ZeroRepSize { fde: u32, offset: usize },
    #[error(
        "sort check: FDE {fde} at offset {offset}: FDE starts not sorted although SFRAME_F_FDE_SORTED is set"
    )]
    FdesNotSorted { fde: u32, offset: usize },
    /// v1/v2: the FDE's FRE offset points past the FRE sub-section.
    #[error(
        "bounds check: FDE {fde} at offset {offset}: its FREs start at offset {fres}, past the FRE sub-section"
    )]
    FreOffsetOutOfBounds { fde: u32, offset: usize, fres: u64 },
    /// v3: the FDE's attribute record is not inside the FRE sub-section.
    #[error(
        "bounds check: FDE {fde} at offset {offset}: its 5-byte attribute record at offset {attr} is outside the FRE sub-section"
    )]
    FdeAttrOutOfBounds { fde: u32, offset: usize, attr: u64 },
    #[error(
        "bounds check: FDE {fde}, FRE {fre} at offset {offset}: its {len} bytes run past the FRE sub-section"
    )]
    FreDataOutOfBounds {
        fde: u32,
        fre: u32,
        offset: usize,
        len: u64,
    },
    #[error(
        "overlap check: FDE {fde}: its FRE data at offset {offset} overlaps another function's"
    )]
    FreDataOverlap { fde: u32, offset: usize },
    #[error(
        "word size check: FDE {fde}, FRE {fre} at offset {offset}: data word size code {code} is invalid"
    )]
    InvalidDataWordSize {
        fde: u32,
        fre: u32,
        offset: usize,
        code: u8,
    },
    #[error(
        "FRE order check: FDE {fde}, FRE {fre} at offset {offset}: start {start} not after the previous row's"
    )]
    FreStartNotIncreasing {
        fde: u32,
        fre: u32,
        offset: usize,
        start: u32,
    },
    #[error(
        "FRE start check: FDE {fde}, FRE {fre} at offset {offset}: start {start} beyond function size {size}"
    )]
    FreStartBeyondFunction {
        fde: u32,
        fre: u32,
        offset: usize,
        start: u32,
        size: u32,
    },
    #[error(
        "word count check: FDE {fde}, FRE {fre} at offset {offset}: {count} data words, this ABI/FDE type uses at most {max}"
    )]
    LeftoverDataWords {
        fde: u32,
        fre: u32,
        offset: usize,
        count: u8,
        max: u8,
    },
    #[error(
        "word count check: FDE {fde}, FRE {fre} at offset {offset}: zero data words (RA undefined) is not valid in SFrame version 1"
    )]
    EmptyFreInV1 { fde: u32, fre: u32, offset: usize },
    #[error(
        "reserved bits check: FDE {fde}, FRE {fre} at offset {offset}: reserved bits {value:#04x} are set in the FRE info byte"
    )]
    FreReservedBits {
        fde: u32,
        fre: u32,
        offset: usize,
        value: u8,
    },
    #[error("FLEX rule check: FDE {fde}, FRE {fre} at offset {offset}: {problem}")]
    BadFlexRule {
        fde: u32,
        fre: u32,
        offset: usize,
        problem: FlexProblem,
    },
    #[error(
        "PC type check: FDE {fde} at offset {offset}: v1 PCMASK FDEs carry no rep_size and are only understood on AMD64"
    )]
    V1PcMaskUnsupported { fde: u32, offset: usize },
    #[error("ELF check: {what}")]
    Elf { what: &'static str },
}

/// A table could not be written in the requested SFrame version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WriteError {
    #[error(
        "function {function}: row {row}: {what} cannot be expressed in SFrame version {version}"
    )]
    Unrepresentable {
        function: usize,
        row: usize,
        version: u8,
        what: &'static str,
    },
    #[error(
        "function {function}: row {row}: start offset {start} not increasing or beyond size {size}"
    )]
    BadRowOrder {
        function: usize,
        row: usize,
        start: u32,
        size: u32,
    },
    #[error("function {function}: rows disagree on {what}, which SFrame stores per function")]
    InconsistentFunction { function: usize, what: &'static str },
    #[error("function {function}: row {row} has no rule; PCMASK functions cannot be split")]
    NoneRowInMaskFunction { function: usize, row: usize },
    #[error(
        "function {function}: start address is out of range of the version's PC-relative field"
    )]
    StartOutOfRange { function: usize },
    #[error("function {function}: {count} rows exceed what one FDE of this version can hold")]
    TooManyRows { function: usize, count: usize },
    #[error("section too large: {what} does not fit 32 bits")]
    TooLarge { what: &'static str },
    #[error("architecture {what} cannot be written")]
    UnsupportedArch { what: &'static str },
}
