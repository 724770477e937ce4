//! Unwind rows derived from DWARF CFI: `.eh_frame` (enumerated through `.eh_frame_hdr`
//! when present), `.debug_frame` (own, or of a separate debug file found by build-id or
//! `.gnu_debuglink`), and synthesized rows for PLT sections.
//!
//! Every FDE's call frame program is evaluated with gimli and each row normalized to an
//! [`UnwindRule`](sframe_common::UnwindRule); rows that no rule expresses (arbitrary DWARF
//! expressions) become explicit `rule: None` ranges. The result is an [`UnwindTable`]
//! (functions sorted, non-overlapping, adjacent identical rows merged) and a
//! [`DeriveStats`] saying what was converted, what was skipped and why, and how many rows
//! and bytes of code fall in each [`RowCategory`].
//!
//! Input is untrusted: nothing here panics or allocates beyond a bound derived from the
//! input's size; a bad FDE is skipped and counted, the rest of the object converts.
//! [`derive_from_elf`] touches no file system and is the fuzzing entry point.
//!
//! Not here: choosing between `.sframe` and CFI per object, and writing SFrame.

mod assemble;
mod cfi;
mod coverage;
mod elf;
mod error;
mod expr;
mod plt;
mod stats;

use std::path::{Path, PathBuf};

pub use cfi::{MAX_FDES, SectionData};
pub use error::{
    CfiSection, DebugFileError, DecompressError, EhFrameError, FdeError, SkipReason, Warning,
};
pub use plt::{PltKind, PltSection};
pub use stats::{CategoryCount, DeriveStats, MAX_KEPT_ERRORS, RowCategory};

use crate::table::{Arch, Source, TableBuilder, UnwindTable};

/// The derived table of one object and what happened on the way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The derived table.
    pub table: UnwindTable,
    /// What was converted and skipped, and the row categories.
    pub stats: DeriveStats,
}

/// Where to look for a separate debug file.
#[derive(Clone, Debug, Default)]
pub struct DeriveOptions {
    /// Root of the debug file tree, usually `/usr/lib/debug`. `None`: do not look.
    pub debug_root: Option<PathBuf>,
    /// Path of the object itself, for `.gnu_debuglink` lookups next to it.
    pub object_path: Option<PathBuf>,
}

/// Largest separate debug file read into memory.
const MAX_DEBUG_FILE_BYTES: u64 = 1 << 31;

/// Raw CFI sections with their load addresses, e.g. of a vDSO read from process memory.
#[derive(Clone, Copy, Debug)]
pub struct CfiSections<'a> {
    /// Architecture of the code the sections describe.
    pub arch: Arch,
    /// `.eh_frame`, when present.
    pub eh_frame: Option<SectionData<'a>>,
    /// `.eh_frame_hdr`, when present: its table enumerates the `.eh_frame` FDEs.
    pub eh_frame_hdr: Option<SectionData<'a>>,
    /// `.debug_frame`, when present.
    pub debug_frame: Option<SectionData<'a>>,
    /// Bases for `DW_EH_PE_textrel` / `DW_EH_PE_datarel` pointers, when known.
    pub text_address: Option<u64>,
    /// Base for `DW_EH_PE_datarel` pointers (the GOT's address), when known.
    pub got_address: Option<u64>,
    /// PLT sections to synthesize rows for.
    pub plts: &'a [PltSection<'a>],
}

/// Derives the table of an ELF file from its own sections only (no file system access).
/// Suitable as a fuzz target over arbitrary bytes.
pub fn derive_from_elf(data: &[u8]) -> Result<Derived, EhFrameError> {
    derive_from_elf_with(data, &DeriveOptions::default())
}

/// Derives the table of an ELF file, adding the `.debug_frame` of its separate debug
/// file (when `options.debug_root` is set and one is found) for code `.eh_frame` does
/// not cover.
pub fn derive_from_elf_with(data: &[u8], options: &DeriveOptions) -> Result<Derived, EhFrameError> {
    derive_from_parsed(&ParsedElf::parse(data)?, options)
}

thread_local! {
    static PARSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one parse of an ELF file's headers on this thread (every place that parses
/// one for a table, its identity or its segments calls it).
pub(crate) fn count_parse() {
    PARSES.with(|c| c.set(c.get() + 1));
}

/// ELF files parsed on this thread so far (for tests: a process load parses each new
/// object once).
#[doc(hidden)]
pub fn parses_on_this_thread() -> u64 {
    PARSES.with(std::cell::Cell::get)
}

/// An ELF file parsed once for everything its table is built from: the object crate's
/// view of its headers and sections ([`ParsedElf::file`]: the `.sframe` section, the
/// entry point, the PLT sections, the segments, what the profiler's content digest
/// hashes) and what the CFI deriver finds in it. The CFI scan is done at its first use
/// (a table taken from a cache needs only the headers).
pub struct ParsedElf<'a> {
    file: object::read::elf::ElfFile64<'a, object::Endianness>,
    cfi: std::cell::OnceCell<Result<elf::ElfCfi<'a>, EhFrameError>>,
}

impl<'a> ParsedElf<'a> {
    /// Parses the 64-bit ELF file `data`.
    pub fn parse(data: &'a [u8]) -> Result<Self, EhFrameError> {
        count_parse();
        object::read::elf::ElfFile64::parse(data)
            .map(Self::new)
            .map_err(EhFrameError::Elf)
    }

    /// The file parsed by the object crate.
    pub fn new(file: object::read::elf::ElfFile64<'a, object::Endianness>) -> Self {
        Self {
            file,
            cfi: std::cell::OnceCell::new(),
        }
    }

    /// The object crate's view of the file.
    pub fn file(&self) -> &object::read::elf::ElfFile64<'a, object::Endianness> {
        &self.file
    }

    /// What the CFI deriver found in the file (scanned once, at the first call).
    fn cfi(&self) -> &Result<elf::ElfCfi<'a>, EhFrameError> {
        self.cfi.get_or_init(|| elf::scan(&self.file))
    }
}

/// [`derive_from_elf_with`] on a file already parsed.
pub fn derive_from_parsed(
    elf: &ParsedElf<'_>,
    options: &DeriveOptions,
) -> Result<Derived, EhFrameError> {
    let info = elf.cfi().as_ref().map_err(Clone::clone)?;
    let mut warnings = info.warnings.clone();
    // A compressed `.debug_frame` (common in debug files: `SHF_COMPRESSED`, zlib or
    // zstd) is decompressed into a buffer this function owns.
    let decompress =
        |c: &elf::CompressedSection<'_>, section: CfiSection, warnings: &mut Vec<Warning>| {
            c.decompress()
                .map_err(|reason| warnings.push(Warning::Compressed { section, reason }))
                .ok()
                .map(|bytes| (bytes, c.address))
        };
    let own_decompressed = match (&info.debug_frame, &info.compressed_debug_frame) {
        (None, Some(c)) => decompress(c, CfiSection::DebugFrame, &mut warnings),
        _ => None,
    };
    let own_debug_frame =
        info.debug_frame.or(own_decompressed
            .as_ref()
            .map(|(data, address)| SectionData {
                data,
                address: *address,
            }));
    let debug_file = match (&options.debug_root, own_debug_frame) {
        (Some(root), None) => {
            read_debug_file(root, info, options.object_path.as_deref(), &mut warnings)
        }
        _ => None,
    };
    let mut separate = None;
    let mut separate_decompressed = None;
    let mut used_debug_file = None;
    if let Some((path, bytes)) = &debug_file {
        match elf::parse(bytes) {
            Ok(d) if d.arch == info.arch => {
                if d.debug_frame.is_some() {
                    separate = d.debug_frame;
                    used_debug_file = Some(path.clone());
                } else if let Some(c) = &d.compressed_debug_frame {
                    separate_decompressed =
                        decompress(c, CfiSection::DebugFrameSeparate, &mut warnings);
                    if separate_decompressed.is_some() {
                        used_debug_file = Some(path.clone());
                    }
                }
            }
            Ok(_) => warnings.push(Warning::DebugFile {
                path: path.clone(),
                reason: DebugFileError::OtherArchitecture,
            }),
            Err(e) => warnings.push(Warning::DebugFile {
                path: path.clone(),
                reason: DebugFileError::Parse(e),
            }),
        }
    }
    let separate = separate.or(separate_decompressed
        .as_ref()
        .map(|(data, address)| SectionData {
            data,
            address: *address,
        }));
    let sections = CfiSections {
        arch: info.arch,
        eh_frame: info.eh_frame,
        eh_frame_hdr: info.eh_frame_hdr,
        debug_frame: own_debug_frame,
        text_address: info.text,
        got_address: info.got,
        plts: &info.plts,
    };
    let mut derived = derive(&sections, info.endian, separate)?;
    let exec = coverage::scan(&mut derived.table, &info.exec);
    derived.stats.exec_bytes = exec.bytes;
    derived.stats.padding_bytes = exec.padding;
    derived.stats.exec_bytes_with_rule = exec.with_rule;
    warnings.append(&mut derived.stats.warnings);
    derived.stats.warnings = warnings;
    derived.stats.debug_file = used_debug_file;
    Ok(derived)
}

/// Derives a table from raw sections (little-endian unless the arch says big-endian).
pub fn derive_from_sections(sections: &CfiSections<'_>) -> Result<Derived, EhFrameError> {
    let endian = match sections.arch {
        Arch::Aarch64 { big_endian: true } | Arch::S390x => gimli::RunTimeEndian::Big,
        _ => gimli::RunTimeEndian::Little,
    };
    derive(sections, endian, None)
}

fn derive(
    s: &CfiSections<'_>,
    endian: gimli::RunTimeEndian,
    separate_debug_frame: Option<SectionData<'_>>,
) -> Result<Derived, EhFrameError> {
    let regs = cfi::ArchRegs::for_arch(s.arch).ok_or(EhFrameError::UnsupportedArch {
        machine: s.arch.elf_machine(),
    })?;
    if s.eh_frame.is_none()
        && s.debug_frame.is_none()
        && separate_debug_frame.is_none()
        && s.plts.is_empty()
    {
        return Err(EhFrameError::NoCfi);
    }
    let env = cfi::Env {
        regs,
        endian,
        address_size: 8,
        text: s.text_address,
        got: s.got_address,
        extra_functions: s.plts.len().saturating_mul(assemble::ROOM_PER_PLT),
    };
    let mut stats = DeriveStats::default();
    // Rows go straight into the table's row array (each distinct rule once); the
    // functions are small descriptors until they are sorted and clipped.
    let mut builder = TableBuilder::new(s.arch, Source::EhFrame);
    let eh = match &s.eh_frame {
        Some(eh) => {
            cfi::convert_eh_frame(eh, s.eh_frame_hdr.as_ref(), &env, &mut stats, &mut builder)?
        }
        None => Vec::new(),
    };
    let mut debug = Vec::new();
    let mut debug_section = CfiSection::DebugFrame;
    if let Some(df) = &s.debug_frame {
        debug =
            cfi::convert_debug_frame(df, CfiSection::DebugFrame, &env, &mut stats, &mut builder)?;
    } else if let Some(df) = &separate_debug_frame {
        debug_section = CfiSection::DebugFrameSeparate;
        debug = cfi::convert_debug_frame(
            df,
            CfiSection::DebugFrameSeparate,
            &env,
            &mut stats,
            &mut builder,
        )?;
    }
    let source = if !eh.is_empty() {
        Source::EhFrame
    } else if !debug.is_empty() {
        Source::DebugFrame
    } else {
        Source::Synthesized
    };
    let functions = assemble::assemble(
        s.arch,
        &mut builder,
        eh,
        (debug, debug_section),
        s.plts,
        &mut stats,
    );
    if builder.rows_over_rule_limit() > 0 {
        stats.warnings.push(Warning::RuleLimit {
            rows: builder.rows_over_rule_limit(),
        });
    }
    let table = builder.finish_with(source, functions);
    stats.count_table(&table);
    Ok(Derived { table, stats })
}

/// Marks the functions of `table` that are followed by alignment padding in the code of
/// the ELF file `elf` (see [`crate::table::Function::padding_after`]); nothing when the
/// deriver could not read the file (an architecture without CFI support).
pub fn mark_padding(elf: &ParsedElf<'_>, table: &mut UnwindTable) {
    if let Ok(info) = elf.cfi() {
        coverage::scan(table, &info.exec);
    }
}

/// Reads the first candidate debug file that exists, is not too large and (when both
/// have one) carries the object's build-id.
fn read_debug_file(
    root: &Path,
    info: &elf::ElfCfi<'_>,
    object_path: Option<&Path>,
    warnings: &mut Vec<Warning>,
) -> Option<(PathBuf, Vec<u8>)> {
    for path in elf::debug_file_candidates(root, info.build_id, info.debuglink, object_path) {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        if meta.len() > MAX_DEBUG_FILE_BYTES {
            warnings.push(Warning::DebugFile {
                path,
                reason: DebugFileError::TooLarge {
                    limit: MAX_DEBUG_FILE_BYTES,
                },
            });
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                warnings.push(Warning::DebugFile {
                    path,
                    reason: DebugFileError::Read(e.kind()),
                });
                continue;
            }
        };
        let id_matches = match (
            info.build_id,
            elf::parse(&bytes).ok().and_then(|d| d.build_id),
        ) {
            (Some(a), Some(b)) => a == b,
            // Without two build-ids, the debuglink's CRC-32 of the whole file says
            // whether it is the object's debug file.
            _ => match info.debuglink_crc {
                Some(crc) if crc32fast::hash(&bytes) != crc => {
                    warnings.push(Warning::DebugFile {
                        path,
                        reason: DebugFileError::Crc {
                            found: crc32fast::hash(&bytes),
                            expected: crc,
                        },
                    });
                    continue;
                }
                _ => true,
            },
        };
        if !id_matches {
            warnings.push(Warning::DebugFile {
                path,
                reason: DebugFileError::OtherBuildId,
            });
            continue;
        }
        return Some((path, bytes));
    }
    None
}
