//! The unwind table of one mapped object, from the best source it has.
//!
//! Per object, [`table_for_elf`] uses:
//! 1. its `.sframe` section when present and valid (converted with
//!    [`Section::to_table`]). "Valid" means: it passes the reader's validation, its ABI
//!    matches the ELF machine, it describes at least one function and its functions do
//!    not overlap. Otherwise the reason is kept in [`ObjectTable::sframe_error`] and
//! 2. the rows derived from `.eh_frame` / `.debug_frame` (and synthesized PLT rows) are
//!    used instead ([`crate::ehframe`]).
//!
//! PLT rows with `.sframe`: GNU ld writes SFrame for `.plt` only in some configurations
//! (not for `.plt.got`, nor for `.plt.sec` before binutils 2.41, and not at all when no
//! input object had SFrame), while the code of every PLT entry is fixed. So, when
//! [`ObjTableOptions::synthesize_plt`] is set (the default), each PLT section
//! (`.plt`, `.plt.sec`, `.plt.got`) that no `.sframe` function touches gets the rows GNU
//! ld would have written (see [`crate::ehframe::PltSection`]); PLT sections the `.sframe`
//! covers, even partly, are left as the `.sframe` says (its rows are the linker's
//! statement about its own code). Code that is covered by `.eh_frame` but not by
//! `.sframe` (e.g. `_start` from crt1.o, assembled without `--gsframe`) is filled in
//! from the CFI when [`ObjTableOptions::fill_from_cfi`] is set (the default): without
//! it, the outermost frame has no rule and the walk cannot tell that it is complete.
//! CFI derivation is cheap (libc's whole `.eh_frame` in a few ms), so correctness wins.
//!
//! Input is untrusted: nothing here panics, and the cost is one ELF parse, one `.sframe`
//! validation when present, and one CFI derivation.

use object::{Object, ObjectSection};

use crate::ehframe::{
    self, CfiSections, DeriveOptions, DeriveStats, EhFrameError, PltKind, PltSection,
};
use crate::sframe::{SFrameError, Section};
use crate::table::{Arch, Function, Source, UnwindTable};

/// What [`table_for_elf`] may do.
#[derive(Clone, Debug)]
pub struct ObjTableOptions {
    /// Where the CFI deriver looks for a separate debug file (`.debug_frame`).
    pub derive: DeriveOptions,
    /// Add synthesized rows for PLT sections the `.sframe` does not cover.
    pub synthesize_plt: bool,
    /// Ignore `.sframe` and always derive from CFI.
    pub ignore_sframe: bool,
    /// With `.sframe`, add the CFI's functions that no `.sframe` function overlaps, and
    /// mark an entry point neither covers as the outermost frame (always done for
    /// tables derived from CFI).
    pub fill_from_cfi: bool,
}

impl Default for ObjTableOptions {
    fn default() -> Self {
        Self {
            derive: DeriveOptions::default(),
            synthesize_plt: true,
            ignore_sframe: false,
            fill_from_cfi: true,
        }
    }
}

/// Why a present `.sframe` section was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SFrameRejection {
    /// The section's bytes could not be read, failed the reader's validation, or could not
    /// be converted to a table.
    #[error(".sframe is invalid: {0}")]
    Invalid(#[source] SFrameError),
    /// The section's ABI is not the ELF file's machine.
    #[error(".sframe describes {sframe:?} code but the ELF machine is {elf:?}")]
    ArchMismatch {
        /// The architecture of the section's ABI.
        sframe: Arch,
        /// The architecture of the ELF machine.
        elf: Arch,
    },
    /// The section describes no function.
    #[error(".sframe describes no function")]
    NoFunctions,
    /// Two functions of the section overlap.
    #[error(".sframe functions {first} and {second} overlap (at {address:#x})")]
    Overlap {
        /// Index of the first function in address order.
        first: usize,
        /// Index of the second function (`first + 1`).
        second: usize,
        /// Start address of the second function.
        address: u64,
    },
}

/// The table of one object and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectTable {
    /// The unwind table.
    pub table: UnwindTable,
    /// `table.source`, repeated for convenience. For an `.sframe` table with added PLT
    /// rows this is still `SFrame`; see `plt_functions`.
    pub source: Source,
    /// Why the object's `.sframe` was not used (`None`: used, or there is none).
    pub sframe_error: Option<SFrameRejection>,
    /// The deriver's statistics when the table comes from CFI.
    pub stats: Option<DeriveStats>,
    /// Functions synthesized for PLT sections and added to an `.sframe` table.
    pub plt_functions: usize,
    /// Functions taken from the CFI where an `.sframe` table had none.
    pub cfi_functions: usize,
    /// The object's `PT_LOAD` segments (read from the same parse, for the bias of its
    /// mappings).
    pub segments: Vec<crate::segments::Segment>,
}

/// No table could be built for an object.
#[derive(Debug, thiserror::Error)]
pub enum ObjTableError {
    /// The bytes are not an ELF file `object` can parse.
    #[error("not a readable ELF file")]
    Elf(#[source] object::read::Error),
    /// Neither the `.sframe` section nor the CFI gave a table.
    #[error("no usable unwind information: {cfi}{}", sframe_note(.sframe))]
    NoUnwindInfo {
        /// Why the `.sframe` section was rejected, when there is one.
        sframe: Option<SFrameRejection>,
        /// Why the CFI deriver failed.
        #[source]
        cfi: EhFrameError,
    },
}

fn sframe_note(s: &Option<SFrameRejection>) -> String {
    s.as_ref().map(|r| format!("; {r}")).unwrap_or_default()
}

/// The unwind table of the ELF image `data`: `.sframe` when present and valid, else the
/// rows derived from its CFI. Never panics on any bytes. The file is parsed once
/// ([`ehframe::ParsedElf`]) for all of it.
pub fn table_for_elf(data: &[u8], opts: &ObjTableOptions) -> Result<ObjectTable, ObjTableError> {
    ehframe::count_parse();
    let elf = ehframe::ParsedElf::new(
        object::read::elf::ElfFile64::parse(data).map_err(ObjTableError::Elf)?,
    );
    table_for_parsed(&elf, opts)
}

/// [`table_for_elf`] on a file already parsed (whose headers served something else
/// too: the profiler hashes them into the object's identity first).
pub fn table_for_parsed(
    elf: &ehframe::ParsedElf<'_>,
    opts: &ObjTableOptions,
) -> Result<ObjectTable, ObjTableError> {
    let file = elf.file();
    let elf_arch = elf_arch(file);
    let mut sframe_error = None;
    if !opts.ignore_sframe
        && let Some(sec) = file.section_by_name(".sframe")
    {
        match sframe_table(&sec, elf_arch) {
            Ok(mut table) => {
                let plt_functions = if opts.synthesize_plt {
                    add_plt_rows(file, &mut table)
                } else {
                    0
                };
                // Code linked in from objects assembled without --gsframe (crt1.o's
                // _start, hand-written assembly) has CFI but no SFrame: take those
                // functions from the CFI, so that the outermost frame is known.
                let cfi_functions = if opts.fill_from_cfi {
                    fill_gaps_from_cfi(elf, &opts.derive, &mut table)
                } else {
                    0
                };
                // The same purpose: an entry point without CFI either is outermost.
                if opts.fill_from_cfi {
                    add_entry_row(file, &mut table);
                }
                ehframe::mark_padding(elf, &mut table);
                return Ok(ObjectTable {
                    segments: crate::segments::of_file(file),
                    source: table.source,
                    table,
                    sframe_error: None,
                    stats: None,
                    plt_functions,
                    cfi_functions,
                });
            }
            Err(e) => sframe_error = Some(e),
        }
    }
    match ehframe::derive_from_parsed(elf, &opts.derive) {
        Ok(mut derived) => Ok(ObjectTable {
            segments: crate::segments::of_file(file),
            source: derived.table.source,
            table: {
                if add_entry_row(file, &mut derived.table) {
                    ehframe::mark_padding(elf, &mut derived.table);
                }
                derived.table
            },
            sframe_error,
            stats: Some(derived.stats),
            plt_functions: 0,
            cfi_functions: 0,
        }),
        Err(cfi) => Err(ObjTableError::NoUnwindInfo {
            sframe: sframe_error,
            cfi,
        }),
    }
}

/// Adds the CFI-derived functions that overlap no function of `table`; returns how many.
fn fill_gaps_from_cfi(
    elf: &ehframe::ParsedElf<'_>,
    derive: &ehframe::DeriveOptions,
    table: &mut UnwindTable,
) -> usize {
    let Ok(derived) = ehframe::derive_from_parsed(elf, derive) else {
        return 0;
    };
    let existing = table.functions();
    let overlaps = |start: u64, end: u64| {
        // First existing function ending after `start`.
        let i = existing.partition_point(|f| f.end() <= start);
        existing.get(i).is_some_and(|f| f.start < end)
    };
    let before = existing.len();
    let merged = table.merged_with(&derived.table, |f| {
        f.size > 0 && !overlaps(f.start, f.end())
    });
    *table = merged;
    table.functions().len() - before
}

fn elf_arch<'d>(file: &impl Object<'d>) -> Option<Arch> {
    let big_endian = !file.is_little_endian();
    match file.architecture() {
        object::Architecture::X86_64 => Some(Arch::Amd64),
        object::Architecture::Aarch64 => Some(Arch::Aarch64 { big_endian }),
        object::Architecture::S390x => Some(Arch::S390x),
        _ => None,
    }
}

/// The validated `.sframe` table, functions sorted and non-overlapping.
fn sframe_table<'d>(
    sec: &impl ObjectSection<'d>,
    elf_arch: Option<Arch>,
) -> Result<UnwindTable, SFrameRejection> {
    let bytes = sec.data().map_err(|_| {
        SFrameRejection::Invalid(SFrameError::Elf {
            what: ".sframe data unreadable",
        })
    })?;
    let section = Section::parse(bytes, sec.address()).map_err(SFrameRejection::Invalid)?;
    if let Some(elf) = elf_arch
        && elf != section.arch()
    {
        return Err(SFrameRejection::ArchMismatch {
            sframe: section.arch(),
            elf,
        });
    }
    let table = section.to_table().map_err(SFrameRejection::Invalid)?;
    if table.functions().is_empty() {
        return Err(SFrameRejection::NoFunctions);
    }
    // to_table returns functions in address order; the unwinder needs them disjoint.
    for (i, w) in table.functions().windows(2).enumerate() {
        if let [a, b] = w
            && a.end() > b.start
        {
            return Err(SFrameRejection::Overlap {
                first: i,
                second: i + 1,
                address: b.start,
            });
        }
    }
    Ok(table)
}

/// Adds synthesized rows for the PLT sections no function of `table` touches; returns
/// how many functions were added.
fn add_plt_rows<'d>(file: &impl Object<'d>, table: &mut UnwindTable) -> usize {
    if !matches!(table.arch, Arch::Amd64 | Arch::Aarch64 { .. }) {
        return 0;
    }
    let plts: Vec<PltSection<'_>> = file
        .sections()
        .filter_map(|s| {
            let kind = match s.name().ok()? {
                ".plt" => PltKind::Plt,
                ".plt.sec" => PltKind::PltSec,
                ".plt.got" => PltKind::PltGot,
                _ => return None,
            };
            let size = s.size();
            let end = s.address().checked_add(size)?;
            if size == 0 || touches(table.functions(), s.address(), end) {
                return None;
            }
            // NOBITS or unreadable data: nothing to recognize, no code to unwind.
            let data = s.data().ok().filter(|d| d.len() as u64 == size)?;
            Some(PltSection {
                kind,
                address: s.address(),
                size,
                data,
            })
        })
        .collect();
    if plts.is_empty() {
        return 0;
    }
    let sections = CfiSections {
        arch: table.arch,
        eh_frame: None,
        eh_frame_hdr: None,
        debug_frame: None,
        text_address: None,
        got_address: None,
        plts: &plts,
    };
    let Ok(derived) = ehframe::derive_from_sections(&sections) else {
        return 0;
    };
    let before = table.functions().len();
    let existing = table.functions();
    let merged = table.merged_with(&derived.table, |f| !touches(existing, f.start, f.end()));
    let n = merged.functions().len() - before;
    if n > 0 {
        *table = merged;
    }
    n
}

/// Longest entry-point code an outermost row covers (glibc's ld.so `_start` and
/// `_dl_start_user` together are about 80 bytes).
const ENTRY_ROW_MAX: u64 = 256;

/// Marks the ELF entry point as the outermost frame when no unwind information covers
/// it: nothing calls an entry point, so a return address there ends the stack. glibc's
/// dynamic loader has no CFI for its `_start` / `_dl_start_user` (the return address of
/// `call _dl_start` and `call _dl_init`): without this row every sample taken while
/// ld.so starts a program (a large share of a short-lived process's samples) ends in
/// `no_rule` although the walk reached the bottom of the stack. The row spans from
/// the entry to the next function, at most [`ENTRY_ROW_MAX`] bytes. Returns whether a
/// row was added.
fn add_entry_row<'d>(file: &impl Object<'d>, table: &mut UnwindTable) -> bool {
    let entry = file.entry();
    if entry == 0 || touches(table.functions(), entry, entry + 1) {
        return false;
    }
    // The entry must be in executable code of the file.
    let in_text = file.sections().any(|s| {
        s.kind() == object::SectionKind::Text
            && s.address() <= entry
            && entry < s.address().saturating_add(s.size())
    });
    if !in_text {
        return false;
    }
    let next = table
        .functions()
        .get(table.functions().partition_point(|f| f.start <= entry))
        .map_or(u64::MAX, |f| f.start);
    let size = next.saturating_sub(entry).min(ENTRY_ROW_MAX);
    let entry_fn = crate::table::FunctionRows {
        start: entry,
        size: size as u32,
        pc_type: crate::table::PcType::Inc,
        rows: vec![crate::table::Row {
            start_offset: 0,
            rule: Some(sframe_common::UnwindRule {
                // Any CFA above the SP: the walk checks progress before it ends on the
                // undefined RA.
                cfa: sframe_common::CfaRule::sp(if table.arch == Arch::Amd64 { 8 } else { 16 }),
                ra: sframe_common::RegRule::Undefined,
                fp: sframe_common::RegRule::Unchanged,
                flags: sframe_common::RuleFlags::default(),
            }),
        }],
    };
    let extra = UnwindTable::from_functions(table.arch, Source::Synthesized, [entry_fn]);
    *table = table.merged_with(&extra, |_| true);
    true
}

/// Whether any function of the sorted, disjoint `fns` intersects `[a, b)`.
fn touches(fns: &[Function], a: u64, b: u64) -> bool {
    let i = fns.partition_point(|f| f.end() <= a);
    fns.get(i).is_some_and(|f| f.start < b && f.end() > a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for data in [&b""[..], b"\x7fELF", &[0u8; 64], &[0xffu8; 200]] {
            assert!(table_for_elf(data, &ObjTableOptions::default()).is_err());
        }
    }

    #[test]
    fn touches_is_half_open() {
        let f = |start, size| crate::table::FunctionRows {
            start,
            size,
            pc_type: crate::table::PcType::Inc,
            rows: Vec::new(),
        };
        let t = UnwindTable::from_functions(
            Arch::Amd64,
            Source::Synthesized,
            [f(0x10, 0x10), f(0x30, 0x10)],
        );
        let fns = t.functions();
        assert!(!touches(fns, 0, 0x10));
        assert!(touches(fns, 0, 0x11));
        assert!(!touches(fns, 0x20, 0x30));
        assert!(touches(fns, 0x3f, 0x50));
        assert!(!touches(fns, 0x40, 0x50));
    }
}
