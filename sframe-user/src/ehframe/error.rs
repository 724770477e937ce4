//! Errors of the CFI deriver: [`EhFrameError`] stops the whole object, [`FdeError`] skips
//! one FDE (counted by [`SkipReason`] in the stats) while the rest of the object converts.

use std::fmt;
use std::path::PathBuf;

/// A section the deriver reads CFI from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CfiSection {
    EhFrame,
    EhFrameHdr,
    DebugFrame,
    /// `.debug_frame` of a separate debug file (build-id or `.gnu_debuglink`).
    DebugFrameSeparate,
}

impl fmt::Display for CfiSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EhFrame => ".eh_frame",
            Self::EhFrameHdr => ".eh_frame_hdr",
            Self::DebugFrame => ".debug_frame",
            Self::DebugFrameSeparate => ".debug_frame (separate debug file)",
        })
    }
}

/// Failures that stop the derivation for a whole object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EhFrameError {
    #[error("not a readable 64-bit ELF file")]
    Elf(#[source] object::read::Error),
    #[error("unsupported ELF machine {machine:#x} (supported: x86-64, AArch64)")]
    UnsupportedArch { machine: u16 },
    #[error("the object has no CFI (.eh_frame, .debug_frame) and no PLT to synthesize")]
    NoCfi,
    #[error("{section}: more than {limit} {what}, the deriver's limit; the object is refused")]
    LimitExceeded {
        section: CfiSection,
        what: &'static str,
        limit: u64,
    },
    #[error("{section} at offset {offset:#x}: {source}")]
    Section {
        section: CfiSection,
        offset: u64,
        #[source]
        source: gimli::Error,
    },
}

/// Why an FDE (or a run of entries) was not converted. Each is a counter in
/// [`DeriveStats::fdes_skipped`](super::DeriveStats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// The FDE's CIE is missing, truncated, or of an unknown version.
    BadCie,
    /// The CIE has an augmentation character neither gimli nor the deriver knows (AArch64 `B` and `G`
    /// are understood: they are flags without data).
    UnknownAugmentation,
    /// The entry header is truncated or its length runs past the section: the rest of
    /// the section cannot be walked.
    Truncated,
    /// The FDE header is undecodable (pointer encodings, CIE pointer).
    BadFde,
    /// The call frame program does not parse or evaluate.
    BadInstructions,
    /// `DW_CFA_remember_state` nested deeper than the evaluator's stack, or
    /// `DW_CFA_restore_state` without a matching remember.
    StateStack,
    /// More register rules than the evaluator holds.
    TooManyRegisterRules,
    /// The FDE covers no code.
    Empty,
    /// The FDE covers more than 4 GiB, wraps around the address space or ends above
    /// 2^48 (where no user-space code lives).
    TooLarge,
    /// The FDE's range is entirely covered by a preferred entry (an earlier FDE, or
    /// `.eh_frame` over `.debug_frame`, or synthesized PLT rows).
    Overlap,
    /// The rows budget of the section was exhausted (only malformed sections get there).
    RowBudget,
}

impl SkipReason {
    pub(crate) fn from_gimli(err: gimli::Error) -> Self {
        use gimli::Error as E;
        match err {
            E::UnknownAugmentation => Self::UnknownAugmentation,
            E::StackFull | E::PopWithEmptyStack => Self::StateStack,
            E::TooManyRegisterRules => Self::TooManyRegisterRules,
            E::UnexpectedEof(_) => Self::Truncated,
            E::UnknownVersion(_) | E::NotCieId | E::NoEntryAtGivenOffset => Self::BadCie,
            E::UnknownPointerEncoding(_)
            | E::UnsupportedPointerEncoding
            | E::PcRelativePointerButSectionBaseIsUndefined
            | E::TextRelativePointerButTextBaseIsUndefined
            | E::DataRelativePointerButDataBaseIsUndefined
            | E::FuncRelativePointerInBadContext
            | E::CannotParseOmitPointerEncoding
            | E::NotCiePointer
            | E::OffsetOutOfBounds => Self::BadFde,
            _ => Self::BadInstructions,
        }
    }
}

/// One skipped FDE (or an entry where a section walk stopped), kept for diagnostics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{section} entry #{index} at offset {offset:#x}: {reason:?}")]
pub struct FdeError {
    pub section: CfiSection,
    /// Index of the entry in enumeration order (FDEs only).
    pub index: usize,
    /// Offset of the entry in its section.
    pub offset: u64,
    pub reason: SkipReason,
    #[source]
    pub source: Option<gimli::Error>,
}

/// Something worth reporting that did not stop the derivation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Warning {
    #[error(".eh_frame_hdr unusable ({source}); walked .eh_frame linearly")]
    HdrUnusable { source: gimli::Error },
    #[error("{section} is compressed and could not be decompressed: {reason}")]
    Compressed {
        section: CfiSection,
        #[source]
        reason: DecompressError,
    },
    #[error("separate debug file {path}: {reason}")]
    DebugFile {
        path: PathBuf,
        #[source]
        reason: DebugFileError,
    },
    #[error("{section} at {address:#x}: unrecognized PLT layout, not synthesized")]
    PltLayout { section: &'static str, address: u64 },
    #[error(
        "more than {limit} distinct rules: {rows} rows kept without a rule",
        limit = crate::table::MAX_TABLE_RULES
    )]
    RuleLimit { rows: u64 },
}

/// Why a compressed section's bytes could not be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    #[error("unreadable compression header")]
    Header,
    #[error("{size} bytes decompressed, more than the limit of {limit}")]
    TooLarge { size: u64, limit: u64 },
    #[error("{format:?}: {source}")]
    Corrupt {
        format: object::CompressionFormat,
        #[source]
        source: object::read::Error,
    },
    #[error("decompressed to {got} bytes, the header says {size}")]
    WrongSize { got: u64, size: u64 },
}

/// Why a separate debug file found for an object was not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugFileError {
    #[error("larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("cannot be read: {0}")]
    Read(std::io::ErrorKind),
    #[error(transparent)]
    Parse(EhFrameError),
    #[error("architecture differs from the object")]
    OtherArchitecture,
    #[error("CRC-32 {found:#010x} differs from the .gnu_debuglink's {expected:#010x}")]
    Crc { found: u32, expected: u32 },
    #[error("build-id differs from the object's")]
    OtherBuildId,
}
