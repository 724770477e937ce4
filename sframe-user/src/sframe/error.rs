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
}

/// An SFrame section failed to parse or validate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum SFrameError {
    #[error("header check: section is {len} bytes, shorter than the {need}-byte header (offset 0)")]
    TruncatedHeader { len: usize, need: usize },
    #[error("magic check: {magic:#06x} at offset 0 is neither 0xdee2 nor byte-swapped 0xdee2")]
    BadMagic { magic: u16 },
    #[error("version check: unsupported SFrame version {version} at offset 2")]
    UnsupportedVersion { version: u8 },
    #[error("flags check: unknown flags {flags:#04x} for version {version} at offset 3")]
    UnknownFlags { flags: u8, version: u8 },
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
        "limit check: the header announces {count} {what} (offsets 8/12), more than the reader's limit of {limit}"
    )]
    LimitExceeded {
        what: &'static str,
        count: u32,
        limit: u32,
    },
    #[error(
        "table limit: the rows have more than {limit} distinct rules, more than one table holds"
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
    #[error("count check: header says {header} FREs, the FDEs describe {found}")]
    FreCountMismatch { header: u32, found: u64 },
    #[error("count check: header FRE length {header} bytes, the FDEs use {used} bytes")]
    FreLenMismatch { header: u32, used: u64 },
    #[error("trailing data check: non-zero byte after the FRE sub-section at offset {offset}")]
    TrailingData { offset: usize },
    #[error("FDE {fde} at offset {offset}: function start address overflows")]
    FunctionStartOverflow { fde: u32, offset: usize },
    #[error("FDE {fde} at offset {offset}: FRE type (address width) code {code} is invalid")]
    InvalidFreType { fde: u32, offset: usize, code: u8 },
    #[error("FDE {fde} at offset {offset}: FDE type {code} (info2) is invalid")]
    InvalidFdeType { fde: u32, offset: usize, code: u8 },
    #[error("FDE {fde} at offset {offset}: reserved bits {value:#04x} are set")]
    FdeReservedBits { fde: u32, offset: usize, value: u8 },
    #[error("FDE {fde} at offset {offset}: PCMASK function with rep_size 0")]
    ZeroRepSize { fde: u32, offset: usize },
    #[error(
        "FDE {fde} at offset {offset}: FDE starts not sorted although SFRAME_F_FDE_SORTED is set"
    )]
    FdesNotSorted { fde: u32, offset: usize },
    #[error("FDE {fde}: FRE data at offset {offset} (+{len} bytes) is outside the FRE sub-section")]
    FreDataOutOfBounds { fde: u32, offset: u64, len: u64 },
    #[error("FDE {fde}: its FRE data at offset {offset} overlaps another function's")]
    FreDataOverlap { fde: u32, offset: usize },
    #[error("FDE {fde}, FRE {fre} at offset {offset}: data word size code {code} is invalid")]
    InvalidDataWordSize {
        fde: u32,
        fre: u32,
        offset: usize,
        code: u8,
    },
    #[error("FDE {fde}, FRE {fre} at offset {offset}: start {start} not after the previous row's")]
    FreStartNotIncreasing {
        fde: u32,
        fre: u32,
        offset: usize,
        start: u32,
    },
    #[error("FDE {fde}, FRE {fre} at offset {offset}: start {start} beyond function size {size}")]
    FreStartBeyondFunction {
        fde: u32,
        fre: u32,
        offset: usize,
        start: u32,
        size: u32,
    },
    #[error(
        "FDE {fde}, FRE {fre} at offset {offset}: {count} data words, this ABI/FDE type uses at most {max}"
    )]
    LeftoverDataWords {
        fde: u32,
        fre: u32,
        offset: usize,
        count: u8,
        max: u8,
    },
    #[error(
        "FDE {fde}, FRE {fre} at offset {offset}: zero data words (RA undefined) is not valid in SFrame version 1"
    )]
    EmptyFreInV1 { fde: u32, fre: u32, offset: usize },
    #[error(
        "FDE {fde}, FRE {fre} at offset {offset}: reserved bits {value:#04x} are set in the FRE info byte"
    )]
    FreReservedBits {
        fde: u32,
        fre: u32,
        offset: usize,
        value: u8,
    },
    #[error("FDE {fde}, FRE {fre} at offset {offset}: FLEX rule invalid: {problem:?}")]
    BadFlexRule {
        fde: u32,
        fre: u32,
        offset: usize,
        problem: FlexProblem,
    },
    #[error(
        "FDE {fde} at offset {offset}: v1 PCMASK FDEs carry no rep_size and are only understood on AMD64"
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
