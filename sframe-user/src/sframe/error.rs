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
    /// The section is shorter than the fixed header.
    #[error("header check: section is {len} bytes, shorter than the {need}-byte header (offset 0)")]
    TruncatedHeader {
        /// Length of the section in bytes.
        len: usize,
        /// Bytes the fixed header takes ([`HEADER_SIZE`](super::header::HEADER_SIZE)).
        need: usize,
    },
    /// The first two bytes are not the SFrame magic (`sfp_magic`, 0xdee2) in either
    /// byte order.
    #[error("magic check: {magic:#06x} at offset 0 is neither 0xdee2 nor byte-swapped 0xdee2")]
    BadMagic {
        /// The first two bytes, read little-endian.
        magic: u16,
    },
    /// The version (`sfp_version`) is not 1, 2 or 3.
    #[error("version check: unsupported SFrame version {version} at offset 2")]
    UnsupportedVersion {
        /// The header's version byte (`sfp_version`).
        version: u8,
    },
    /// Flag bits no SFrame version defines.
    #[error(
        "flags check: flags {flags:#04x} at offset 3 have unknown bits {:#04x} (version {version})",
        .flags & !super::header::KNOWN_FLAGS
    )]
    UnknownFlags {
        /// The header's flags byte (`sfp_flags`).
        flags: u8,
        /// The header's version byte (`sfp_version`).
        version: u8,
    },
    /// A flag defined by other versions only (`SFRAME_F_FRAME_POINTER` in v3,
    /// `SFRAME_F_FDE_FUNC_START_PCREL` in v1).
    #[error(
        "flags check: {} ({flag:#04x}) in the flags at offset 3 is not valid in SFrame version {version}",
        flag_name(.flag)
    )]
    FlagNotInVersion {
        /// The flag bit (the lowest one, if several are not valid).
        flag: u8,
        /// The header's version byte (`sfp_version`).
        version: u8,
    },
    /// The ABI/arch byte (`sfh_abi_arch`) names no ABI this reader knows.
    #[error("ABI check: unknown ABI/arch {abi} at offset 4")]
    UnknownAbi {
        /// The header's ABI/arch byte (`sfh_abi_arch`).
        abi: u8,
    },
    /// The ABI's byte order is not the one the magic was found in.
    #[error("ABI check: ABI/arch {abi} at offset 4 does not match the section's byte order")]
    AbiEndianMismatch {
        /// The header's ABI/arch byte (`sfh_abi_arch`).
        abi: u8,
    },
    /// A sub-section (auxiliary header, FDEs or FREs) does not fit in the section.
    #[error(
        "bounds check: {which} [{start}, {start}+{len}) is outside the {section_len}-byte section"
    )]
    SubsectionOutOfBounds {
        /// The sub-section.
        which: Subsection,
        /// Its byte offset in the section.
        start: u64,
        /// Its length in bytes.
        len: u64,
        /// Length of the section in bytes.
        section_len: usize,
    },
    /// The header announces more FDEs than [`MAX_FUNCTIONS`](super::read::MAX_FUNCTIONS) or more
    /// FREs than [`MAX_SECTION_ROWS`](super::read::MAX_SECTION_ROWS).
    #[error(
        "limit check: the header field at offset {offset} announces {count} {what}, more than the reader's limit of {limit}"
    )]
    LimitExceeded {
        /// What is counted: `"FDEs"` or `"FREs"`.
        what: &'static str,
        /// The count the header announces.
        count: u32,
        /// The reader's limit for it.
        limit: u32,
        /// Offset of the header field (8: FDE count, 12: FRE count).
        offset: usize,
    },
    /// [`Section::to_table`](super::read::Section::to_table): the rows have more distinct
    /// rules than one table holds.
    #[error(
        "table limit check: the rows have more than {limit} distinct rules, more than one table holds"
    )]
    TooManyRules {
        /// The most distinct rules one table holds
        /// ([`MAX_TABLE_RULES`](crate::table::MAX_TABLE_RULES)).
        limit: u32,
    },
    /// The FDE sub-section starts after the FRE sub-section (`sfh_fdeoff` > `sfh_freoff`).
    #[error(
        "layout check: FDE offset {fdeoff} is after FRE offset {freoff} (header offsets 20/24)"
    )]
    SubsectionOrder {
        /// The header's `sfh_fdeoff`.
        fdeoff: u32,
        /// The header's `sfh_freoff`.
        freoff: u32,
    },
    /// The FDEs the header announces do not exactly fill the space from `sfh_fdeoff` to
    /// `sfh_freoff`.
    #[error(
        "count check: {num_fdes} FDEs of {fde_size} bytes do not fill the {space}-byte FDE sub-section at offset {offset}"
    )]
    FdeCountMismatch {
        /// The header's FDE count (`sfh_num_fdes`).
        num_fdes: u32,
        /// Bytes per FDE in this version.
        fde_size: u32,
        /// Bytes from `sfh_fdeoff` to `sfh_freoff`.
        space: u64,
        /// Byte offset of the FDE sub-section in the section.
        offset: usize,
    },
    /// The header's FRE count (`sfh_num_fres`) is not the sum of the FDEs' FRE counts.
    #[error(
        "count check: the header's FRE count at offset {offset} is {header}, the FDEs describe {found}"
    )]
    FreCountMismatch {
        /// The header's `sfh_num_fres`.
        header: u32,
        /// The sum of the FDEs' FRE counts.
        found: u64,
        /// Offset of the header field (`sfh_num_fres`: 12).
        offset: usize,
    },
    /// The header's FRE sub-section length (`sfh_fre_len`) is not the number of bytes
    /// the FDEs' FREs (and v3 attribute records) use.
    #[error(
        "length check: the header's FRE sub-section length at offset {offset} is {header} bytes, the FDEs use {used}"
    )]
    FreLenMismatch {
        /// The header's `sfh_fre_len`.
        header: u32,
        /// Bytes the FDEs' FREs use, v3 attribute records included.
        used: u64,
        /// Offset of the header field (`sfh_fre_len`: 16).
        offset: usize,
    },
    /// A non-zero byte follows the FRE sub-section (zero padding is accepted).
    #[error("trailing data check: non-zero byte after the FRE sub-section at offset {offset}")]
    TrailingData {
        /// Byte offset of the first non-zero byte in the section.
        offset: usize,
    },
    /// A PC-relative function start (`sfde_func_start_address` plus the FDE's own
    /// offset) overflows a signed 64-bit offset.
    #[error("start address check: FDE {fde} at offset {offset}: function start address overflows")]
    FunctionStartOverflow {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
    },
    /// The FDE's FRE type (start-address width code, bits 0..=3 of `sfde_func_info`) is
    /// not 0, 1 or 2.
    #[error("FRE type check: FDE {fde} at offset {offset}: address width code {code} is invalid")]
    InvalidFreType {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
        /// The FRE type code found.
        code: u8,
    },
    /// v3: the FDE type (bits 0..=4 of `sfde_func_info2`) is neither DEFAULT (0) nor
    /// FLEX (1).
    #[error("FDE type check: FDE {fde} at offset {offset}: FDE type {code} (info2) is invalid")]
    InvalidFdeType {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
        /// The FDE type code found.
        code: u8,
    },
    /// Reserved bits of the info byte, or the AArch64 pointer-authentication key bit on
    /// another ABI.
    #[error(
        "reserved bits check: FDE {fde} at offset {offset}: info byte {value:#04x} has reserved bits set"
    )]
    FdeReservedBits {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
        /// The info byte (`sfde_func_info`).
        value: u8,
    },
    /// Reserved bits (7..5) of a v3 attribute record's info2 byte; `offset` is the
    /// info2 byte's.
    #[error(
        "reserved bits check: FDE {fde}: info2 byte {value:#04x} at offset {offset} has reserved bits set"
    )]
    FdeInfo2ReservedBits {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the info2 byte in the section.
        offset: usize,
        /// The info2 byte (`sfde_func_info2`).
        value: u8,
    },
    /// A PCMASK FDE has a repetition size (`sfde_func_rep_size`) of 0.
    #[error("rep_size check: FDE {fde} at offset {offset}: PCMASK function with rep_size 0")]
    ZeroRepSize {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
    },
    /// The header sets `SFRAME_F_FDE_SORTED` but an FDE starts below the previous one.
    #[error(
        "sort check: FDE {fde} at offset {offset}: FDE starts not sorted although SFRAME_F_FDE_SORTED is set"
    )]
    FdesNotSorted {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
    },
    /// v1/v2: the FDE's FRE offset points past the FRE sub-section.
    #[error(
        "bounds check: FDE {fde} at offset {offset}: its FREs start at offset {fres}, past the FRE sub-section"
    )]
    FreOffsetOutOfBounds {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
        /// Byte offset in the section where the FDE says its FREs start.
        fres: u64,
    },
    /// v3: the FDE's attribute record is not inside the FRE sub-section.
    #[error(
        "bounds check: FDE {fde} at offset {offset}: its 5-byte attribute record at offset {attr} is outside the FRE sub-section"
    )]
    FdeAttrOutOfBounds {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
        /// Byte offset in the section of the attribute record.
        attr: u64,
    },
    /// An FRE runs past the end of the FRE sub-section.
    #[error(
        "bounds check: FDE {fde}, FRE {fre} at offset {offset}: its {len} bytes run past the FRE sub-section"
    )]
    FreDataOutOfBounds {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// The FRE's length in bytes as far as it could be decoded: its start address and
        /// info byte, and the data words the info byte announces.
        len: u64,
    },
    /// The FRE data (v3: with the attribute record) of two functions overlap.
    #[error(
        "overlap check: FDE {fde}: its FRE data at offset {offset} overlaps another function's"
    )]
    FreDataOverlap {
        /// The higher on-disk index of the two FDEs.
        fde: u32,
        /// Byte offset in the section where the later of the two data ranges starts.
        offset: usize,
    },
    /// An FRE's data word size code (bits 5..=6 of its info byte) is the invalid 3.
    #[error(
        "word size check: FDE {fde}, FRE {fre} at offset {offset}: data word size code {code} is invalid"
    )]
    InvalidDataWordSize {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// The size code found.
        code: u8,
    },
    /// An FRE's start offset is not above the previous FRE's.
    #[error(
        "FRE order check: FDE {fde}, FRE {fre} at offset {offset}: start {start} not after the previous row's"
    )]
    FreStartNotIncreasing {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// The FRE's start offset (`sfre_start_address`) from the function start.
        start: u32,
    },
    /// An FRE's start offset is beyond the function's size.
    #[error(
        "FRE start check: FDE {fde}, FRE {fre} at offset {offset}: start {start} beyond function size {size}"
    )]
    FreStartBeyondFunction {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// The FRE's start offset (`sfre_start_address`) from the function start.
        start: u32,
        /// The function's size in bytes (`sfde_func_size`).
        size: u32,
    },
    /// A DEFAULT FRE has more data words than the header's fixed offsets leave room for
    /// ([`Header::max_default_words`](super::header::Header::max_default_words)).
    #[error(
        "word count check: FDE {fde}, FRE {fre} at offset {offset}: {count} data words, this ABI/FDE type uses at most {max}"
    )]
    LeftoverDataWords {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// Data words the FRE's info byte announces.
        count: u8,
        /// The most the FRE may have.
        max: u8,
    },
    /// A v1 FRE has no data words (v2 and later use that for an undefined RA).
    #[error(
        "word count check: FDE {fde}, FRE {fre} at offset {offset}: zero data words (RA undefined) is not valid in SFrame version 1"
    )]
    EmptyFreInV1 {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
    },
    /// The FRE's mangled-RA bit (bit 7 of its info byte) is set on an ABI other than
    /// AArch64.
    #[error(
        "reserved bits check: FDE {fde}, FRE {fre} at offset {offset}: reserved bits {value:#04x} are set in the FRE info byte"
    )]
    FreReservedBits {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// The FRE's info byte.
        value: u8,
    },
    /// A v3 FLEX FRE's data words do not form a rule.
    #[error("FLEX rule check: FDE {fde}, FRE {fre} at offset {offset}: {problem}")]
    BadFlexRule {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Index of the FRE within its function.
        fre: u32,
        /// Byte offset of the FRE in the section.
        offset: usize,
        /// What is wrong with them.
        problem: FlexProblem,
    },
    /// A v1 PCMASK FDE on an ABI other than AMD64 (v1 has no `rep_size` field; AMD64's
    /// PLT entries are 16 bytes).
    #[error(
        "PC type check: FDE {fde} at offset {offset}: v1 PCMASK FDEs carry no rep_size and are only understood on AMD64"
    )]
    V1PcMaskUnsupported {
        /// Index of the FDE in the section's on-disk order.
        fde: u32,
        /// Byte offset of the FDE (v3: its index entry) in the section.
        offset: usize,
    },
    /// The ELF file could not be read or has no readable `.sframe` section
    /// ([`Section::from_elf`](super::read::Section::from_elf)).
    #[error("ELF check: {what}")]
    Elf {
        /// What failed.
        what: &'static str,
    },
}

/// A table could not be written in the requested SFrame version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WriteError {
    /// A row's rule (or a function's flag) cannot be stored in the requested version.
    #[error(
        "function {function}: row {row}: {what} cannot be expressed in SFrame version {version}"
    )]
    Unrepresentable {
        /// Index of the function in
        /// [`UnwindTable::functions`](crate::table::UnwindTable::functions).
        function: usize,
        /// Index of the row within its function.
        row: usize,
        /// The SFrame version being written.
        version: u8,
        /// What cannot be stored.
        what: &'static str,
    },
    /// A function's row start offsets do not strictly increase, or one is beyond the
    /// function's size.
    #[error(
        "function {function}: row {row}: start offset {start} not increasing or beyond size {size}"
    )]
    BadRowOrder {
        /// Index of the function in
        /// [`UnwindTable::functions`](crate::table::UnwindTable::functions).
        function: usize,
        /// Index of the row within its function.
        row: usize,
        /// The row's start offset from the function start.
        start: u32,
        /// The function's size in bytes.
        size: u32,
    },
    /// The rows of a function disagree on a property SFrame stores once per function
    /// (the signal-frame flag, the pointer-authentication key).
    #[error("function {function}: rows disagree on {what}, which SFrame stores per function")]
    InconsistentFunction {
        /// Index of the function in
        /// [`UnwindTable::functions`](crate::table::UnwindTable::functions).
        function: usize,
        /// The property.
        what: &'static str,
    },
    /// A PCMASK function has a row without a rule (such a function cannot be split).
    #[error("function {function}: row {row} has no rule; PCMASK functions cannot be split")]
    NoneRowInMaskFunction {
        /// Index of the function in
        /// [`UnwindTable::functions`](crate::table::UnwindTable::functions).
        function: usize,
        /// Index of the row within its function.
        row: usize,
    },
    /// A function's start is out of range of the version's PC-relative start field
    /// (signed 32 bits in v2, 64 bits in v3).
    #[error(
        "function {function}: start address is out of range of the version's PC-relative field"
    )]
    StartOutOfRange {
        /// Index of the function in
        /// [`UnwindTable::functions`](crate::table::UnwindTable::functions).
        function: usize,
    },
    /// A function has more rows than one FDE of the version can count.
    #[error("function {function}: {count} rows exceed what one FDE of this version can hold")]
    TooManyRows {
        /// Index of the function in
        /// [`UnwindTable::functions`](crate::table::UnwindTable::functions).
        function: usize,
        /// Rows of the function (or of the part of it that would become one FDE).
        count: usize,
    },
    /// The section is too large for one of its 32-bit fields.
    #[error("section too large: {what} does not fit 32 bits")]
    TooLarge {
        /// What does not fit: the FDE count, or an FDE or FRE sub-section offset or length.
        what: &'static str,
    },
}
