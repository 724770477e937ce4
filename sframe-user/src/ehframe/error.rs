//! Errors of the CFI deriver: [`EhFrameError`] stops the whole object, [`FdeError`] skips
//! one FDE (counted by [`SkipReason`] in the stats) while the rest of the object converts.

use std::fmt;
use std::path::PathBuf;

/// A section the deriver reads CFI from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CfiSection {
    /// `.eh_frame`.
    EhFrame,
    /// `.eh_frame_hdr` (its binary-search table lists the `.eh_frame` FDEs).
    EhFrameHdr,
    /// The object's own `.debug_frame`.
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
    /// The bytes are not a 64-bit ELF file `object` can parse.
    #[error("not a readable 64-bit ELF file")]
    Elf(#[source] object::read::Error),
    /// The ELF machine is not one the deriver handles (x86-64, AArch64).
    #[error("unsupported ELF machine {machine:#x} (supported: x86-64, AArch64)")]
    UnsupportedArch {
        /// The ELF header's `e_machine`.
        machine: u16,
    },
    /// The object has no `.eh_frame`, no `.debug_frame` (own or separate) and no PLT
    /// section to synthesize rows for.
    #[error("the object has no CFI (.eh_frame, .debug_frame) and no PLT to synthesize")]
    NoCfi,
    /// A section has more entries than the deriver accepts ([`MAX_FDES`](super::MAX_FDES) FDEs).
    #[error("{section}: more than {limit} {what}, the deriver's limit; the object is refused")]
    LimitExceeded {
        /// The section.
        section: CfiSection,
        /// What is counted (`"FDEs"`).
        what: &'static str,
        /// The deriver's limit.
        limit: u64,
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
    /// The section the entry is in.
    pub section: CfiSection,
    /// Index of the entry in enumeration order (FDEs only).
    pub index: usize,
    /// Offset of the entry in its section.
    pub offset: u64,
    /// Why the entry was skipped.
    pub reason: SkipReason,
    /// gimli's error, when gimli reported one.
    #[source]
    pub source: Option<gimli::Error>,
}

/// Something worth reporting that did not stop the derivation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Warning {
    /// `.eh_frame_hdr` could not be used to enumerate the FDEs; `.eh_frame` was walked
    /// from start to end instead.
    #[error(".eh_frame_hdr unusable ({source}); walked .eh_frame linearly")]
    HdrUnusable {
        /// gimli's error about the header.
        source: gimli::Error,
    },
    /// A compressed (`SHF_COMPRESSED`) `.debug_frame` could not be decompressed; it was
    /// not used.
    #[error("{section} is compressed and could not be decompressed: {reason}")]
    Compressed {
        /// The section.
        section: CfiSection,
        /// Why it could not be decompressed.
        #[source]
        reason: DecompressError,
    },
    /// A separate debug file was found but not used.
    #[error("separate debug file {path}: {reason}")]
    DebugFile {
        /// Path of the debug file.
        path: PathBuf,
        /// Why it was not used.
        #[source]
        reason: DebugFileError,
    },
    /// A PLT section whose entries were not recognized (or that ends above 2^48, where no
    /// user-space code lives): no rows were synthesized for it.
    #[error("{section} at {address:#x}: unrecognized PLT layout, not synthesized")]
    PltLayout {
        /// The PLT section's name (e.g. `.plt`).
        section: &'static str,
        /// The section's virtual address.
        address: u64,
    },
    /// The object has more distinct rules than a table holds
    /// ([`MAX_TABLE_RULES`](crate::table::MAX_TABLE_RULES)); rows of the rules past the
    /// limit were kept without a rule.
    #[error(
        "more than {limit} distinct rules: {rows} rows kept without a rule",
        limit = crate::table::MAX_TABLE_RULES
    )]
    RuleLimit {
        /// Rows kept without a rule.
        rows: u64,
    },
}

/// Why a compressed section's bytes could not be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    /// The compression header could not be read.
    #[error("unreadable compression header")]
    Header,
    /// The compression header announces more bytes than the deriver decompresses.
    #[error("{size} bytes decompressed, more than the limit of {limit}")]
    TooLarge {
        /// Decompressed size in bytes, as the compression header says.
        size: u64,
        /// The most bytes the deriver decompresses.
        limit: u64,
    },
    /// Decompression failed.
    #[error("{format:?}: {source}")]
    Corrupt {
        /// The compression format.
        format: object::CompressionFormat,
        /// The decompressor's error.
        #[source]
        source: object::read::Error,
    },
    /// The data decompressed to another size than the compression header says.
    #[error("decompressed to {got} bytes, the header says {size}")]
    WrongSize {
        /// Bytes decompressed.
        got: u64,
        /// Bytes the compression header announces.
        size: u64,
    },
}

/// Why a separate debug file found for an object was not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DebugFileError {
    /// The file is larger than the deriver reads into memory.
    #[error("larger than {limit} bytes")]
    TooLarge {
        /// The largest file the deriver reads, in bytes.
        limit: u64,
    },
    /// The file could not be read (the I/O error's kind).
    #[error("cannot be read: {0}")]
    Read(std::io::ErrorKind),
    /// The file could not be parsed (the deriver's error for it).
    #[error(transparent)]
    Parse(EhFrameError),
    /// The file is for another architecture than the object.
    #[error("architecture differs from the object")]
    OtherArchitecture,
    /// The file's CRC-32 differs from the one in the object's `.gnu_debuglink` (checked
    /// when the object and the file do not both have a build-id).
    #[error("CRC-32 {found:#010x} differs from the .gnu_debuglink's {expected:#010x}")]
    Crc {
        /// CRC-32 of the whole file.
        found: u32,
        /// CRC-32 from the object's `.gnu_debuglink`.
        expected: u32,
    },
    /// The file's build-id differs from the object's.
    #[error("build-id differs from the object's")]
    OtherBuildId,
}
