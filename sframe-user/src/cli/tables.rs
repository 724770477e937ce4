//! Subcommands that inspect and produce unwind tables of files: `dump`, `lookup`,
//! `check`, `gen`.
//!
//! Exit status: 0 on success, 1 when `check` finds a disagreement (or an output file
//! cannot be written), 2 when the input cannot be read or is malformed; errors are one
//! line on stderr naming the file, the check that failed and the offset.

use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use sframe_common::{RuleFlags, UnwindRule};
use sframe_user::ehframe::{self, DeriveOptions, DeriveStats, RowCategory};
use sframe_user::sframe::{
    self, Abi, Section, WriteError, WriteOptions, WriteStats, WriteVersion, dump_to_string,
    lookup_line, write_section,
};
use sframe_user::table::{Arch, FunctionRows, PcType, UnwindTable};

use super::elf_add;

const LOOKUP_HELP: &str = "\
Output, one line per address, in input order:
  0xADDR FOUND cfa_base=sp|fp|none cfa_off=N|none fp_off=N|none ra_off=N|none [EXTRA...]
  0xADDR NOTFOUND
  TOKEN INVALID            (the argument is not a hex address)
fp_off/ra_off are the CFA-relative save slots (ra_off on AMD64 is the fixed offset -8 of
the SFrame header). Rules that do not fit these fields (SFrame v3 FLEX rows, signal
frames, AArch64 pointer authentication) print extra fields after them:
  cfa_base=rN        CFA computed from DWARF register N (top frame only)
  cfa_deref=1        CFA = *(base + cfa_off), e.g. DRAP-realigned frames
  ra=undefined       outermost frame (_start, clone): the walk ends here; such a row
                     has no CFA, so it prints cfa_base=none cfa_off=none
  ra=rN, fp=rN       the value is held in DWARF register N
  ra=(rN+off)        the value is saved at register N + off (also fp=)
  ra=c+off           the value is CFA + off (also fp=)
  signal=1           signal trampoline
  mangled_ra=1       the RA is signed (AArch64 PAC); pauth_key=b when key B
With -v: fde=I (FDE index, on-disk order) func_start=0xADDR after the fields.
Exit status: 0 when the file could be read (whatever the lookups found), 2 otherwise.";

#[derive(Subcommand, Debug)]
pub enum TablesCommand {
    /// Print a .sframe section as binutils 2.46 `objdump --sframe=.sframe` does.
    Dump(DumpArgs),
    /// Look up the unwind rule of addresses in a file's .sframe section.
    #[command(after_long_help = LOOKUP_HELP)]
    Lookup(LookupArgs),
    /// Report every PC range where .sframe and .eh_frame disagree (exit 1 if any).
    #[command(
        long_about = "Report every PC range where an object's .sframe and the rows derived \
from its .eh_frame/.debug_frame disagree, on rows both can express (SFrame v1/v2: CFA = \
SP/FP + offset with RA/FP unchanged or saved at CFA + offset; v3 also FLEX rows). \
Ranges covered by only one of them are counted, not reported.\n\nExit status: 0 when they \
agree (or the object lacks one of the two), 1 on any disagreement, 2 when the file cannot \
be read or its .sframe is malformed."
    )]
    Check(CheckArgs),
    /// Write an SFrame section derived from the file's DWARF CFI.
    #[command(
        long_about = "Write a standalone SFrame section derived from the file's .eh_frame / \
.debug_frame (and synthesized PLT rows). Version 2 uses SFRAME_F_FDE_FUNC_START_PCREL; \
version 3 uses FLEX rows for what the default rows cannot express. Rows that the chosen \
version cannot express are left out (lookups there find nothing); their count is printed.\n\n\
The section is encoded for the address given with --section-addr, by default the page \
after the file's highest PT_LOAD segment (where --elf puts it). --elf OUT_ELF also writes \
a copy of the file with the section added as an allocated .sframe in a new read-only \
PT_LOAD segment."
    )]
    Gen(GenArgs),
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// ELF file (or, with --raw, the bytes of an SFrame section).
    file: PathBuf,
    /// FILE holds raw SFrame section bytes, loaded at --section-addr.
    #[arg(long, requires = "section_addr", conflicts_with = "from_eh_frame")]
    raw: bool,
    /// Virtual address of the raw section (hex, with or without 0x).
    #[arg(long, value_name = "ADDR", value_parser = parse_hex, requires = "raw")]
    section_addr: Option<u64>,
    /// Dump the rows derived from .eh_frame/.debug_frame, encoded as `gen` does.
    #[arg(long)]
    from_eh_frame: bool,
    /// SFrame version of the encoding for --from-eh-frame.
    #[arg(long = "version", value_name = "2|3", default_value = "3", value_parser = parse_version, requires = "from_eh_frame")]
    sframe_version: WriteVersion,
}

#[derive(Args, Debug)]
pub struct LookupArgs {
    /// ELF file with a .sframe section.
    file: PathBuf,
    /// Addresses (hex, with or without 0x); none: one per line on stdin.
    addrs: Vec<String>,
    /// Add the FDE index and function start after the fields.
    #[arg(short, long)]
    verbose: bool,
    /// Look up in the rows derived from .eh_frame/.debug_frame (as `gen` encodes them).
    #[arg(long)]
    from_eh_frame: bool,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// ELF file.
    file: PathBuf,
    /// Print at most this many disagreeing ranges (all are counted).
    #[arg(long, default_value_t = 1000)]
    max_report: usize,
}

#[derive(Args, Debug)]
pub struct GenArgs {
    /// ELF file whose CFI is converted.
    file: PathBuf,
    /// Output file for the section bytes.
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    /// SFrame version to write.
    #[arg(long = "version", value_name = "2|3", default_value = "3", value_parser = parse_version)]
    sframe_version: WriteVersion,
    /// Also write a copy of FILE with the section added as an allocated .sframe.
    #[arg(long, value_name = "OUT_ELF")]
    elf: Option<PathBuf>,
    /// Encode the section for this address instead of the default (hex).
    #[arg(long, value_name = "ADDR", value_parser = parse_hex, conflicts_with = "elf")]
    section_addr: Option<u64>,
}

fn parse_hex(s: &str) -> Result<u64, String> {
    parse_addr(s).ok_or_else(|| format!("'{s}' is not a hex address"))
}

fn parse_addr(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

fn parse_version(s: &str) -> Result<WriteVersion, String> {
    match s {
        "2" => Ok(WriteVersion::V2),
        "3" => Ok(WriteVersion::V3),
        _ => Err(format!(
            "'{s}': only SFrame versions 2 and 3 can be written"
        )),
    }
}

/// Runs a subcommand; returns the exit status.
pub fn run(cmd: TablesCommand) -> i32 {
    let result = match cmd {
        TablesCommand::Dump(a) => dump(&a),
        TablesCommand::Lookup(a) => lookup(&a),
        TablesCommand::Check(a) => check(&a),
        TablesCommand::Gen(a) => gen_cmd(&a),
    };
    match result {
        Ok(status) => status,
        Err(f) => {
            // One line: the messages of the layers below may not contain newlines.
            let msg = f.msg.replace('\n', "; ");
            eprintln!("sframe-user: {}: {msg}", f.file.display());
            f.status
        }
    }
}

/// A failure: the file it is about, a one-line message, the exit status.
struct Failure {
    file: PathBuf,
    msg: String,
    status: i32,
}

type Res<T> = Result<T, Failure>;

fn fail(file: &Path, status: i32, msg: impl std::fmt::Display) -> Failure {
    Failure {
        file: file.to_path_buf(),
        msg: msg.to_string(),
        status,
    }
}

fn read(file: &Path) -> Res<Vec<u8>> {
    std::fs::read(file).map_err(|e| fail(file, 2, format_args!("cannot read: {e}")))
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The BFD target name objdump prints in its "file format" line.
fn elf_format(data: &[u8]) -> &'static str {
    let class64 = data.get(4) == Some(&2);
    let big = data.get(5) == Some(&2);
    let machine = match (data.get(18), data.get(19)) {
        (Some(&a), Some(&b)) if big => u16::from_be_bytes([a, b]),
        (Some(&a), Some(&b)) => u16::from_le_bytes([a, b]),
        _ => 0,
    };
    match (class64, big, machine) {
        (true, false, object::elf::EM_X86_64) => "elf64-x86-64",
        (true, false, object::elf::EM_AARCH64) => "elf64-littleaarch64",
        (true, true, object::elf::EM_AARCH64) => "elf64-bigaarch64",
        (true, true, object::elf::EM_S390) => "elf64-s390",
        (false, false, object::elf::EM_386) => "elf32-i386",
        (true, false, _) => "elf64-little",
        (true, true, _) => "elf64-big",
        (false, false, _) => "elf32-little",
        (false, true, _) => "elf32-big",
    }
}

fn abi_format(abi: Abi) -> &'static str {
    match abi {
        Abi::Amd64LittleEndian => "elf64-x86-64",
        Abi::Aarch64LittleEndian => "elf64-littleaarch64",
        Abi::Aarch64BigEndian => "elf64-bigaarch64",
        Abi::S390xBigEndian => "elf64-s390",
    }
}

fn dump_text(file: &Path, format: &str, section: &Section<'_>) -> String {
    format!(
        "\n{}:     file format {format}\n\n{}",
        file.display(),
        dump_to_string(section)
    )
}

fn dump(a: &DumpArgs) -> Res<i32> {
    let data = read(&a.file)?;
    if a.from_eh_frame {
        let derived = derive(&a.file, &data)?;
        let addr = default_section_addr(&data);
        let enc =
            encode(&derived.table, a.sframe_version, addr).map_err(|e| fail(&a.file, 2, e))?;
        let section = Section::parse(&enc.bytes, addr)
            .map_err(|e| fail(&a.file, 1, format_args!("internal: written SFrame: {e}")))?;
        emit(&dump_text(&a.file, elf_format(&data), &section));
        return Ok(0);
    }
    let text = if a.raw {
        let section =
            Section::parse(&data, a.section_addr.unwrap_or(0)).map_err(|e| fail(&a.file, 2, e))?;
        dump_text(&a.file, abi_format(section.abi()), &section)
    } else {
        let section = Section::from_elf_bytes(&data).map_err(|e| fail(&a.file, 2, e))?;
        dump_text(&a.file, elf_format(&data), &section)
    };
    emit(&text);
    Ok(0)
}

fn lookup(a: &LookupArgs) -> Res<i32> {
    let data = read(&a.file)?;
    let encoded;
    let section = if a.from_eh_frame {
        let derived = derive(&a.file, &data)?;
        let addr = default_section_addr(&data);
        encoded =
            encode(&derived.table, WriteVersion::V3, addr).map_err(|e| fail(&a.file, 2, e))?;
        Section::parse(&encoded.bytes, addr)
            .map_err(|e| fail(&a.file, 1, format_args!("internal: written SFrame: {e}")))?
    } else {
        Section::from_elf_bytes(&data).map_err(|e| fail(&a.file, 2, e))?
    };
    let one = |tok: &str| -> String {
        let Some(addr) = parse_addr(tok) else {
            return format!("{} INVALID\n", tok.trim());
        };
        let mut line = lookup_line(&section, addr);
        if a.verbose
            && let Some((fde, _)) = section.find_fre_raw(addr)
        {
            line.push_str(&format!(" fde={} func_start={:#x}", fde.index, fde.start));
        }
        line.push('\n');
        line
    };
    let mut out = String::new();
    if a.addrs.is_empty() {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if !l.trim().is_empty() {
                out.push_str(&one(&l));
            }
            if out.len() > 1 << 16 {
                emit(&out);
                out.clear();
            }
        }
    } else {
        for t in &a.addrs {
            out.push_str(&one(t));
        }
    }
    emit(&out);
    Ok(0)
}

// ---------------------------------------------------------------------------------------
// Deriving and encoding

fn derive(file: &Path, data: &[u8]) -> Res<ehframe::Derived> {
    let opts = DeriveOptions {
        debug_root: Some(PathBuf::from("/usr/lib/debug")),
        object_path: Some(file.to_path_buf()),
    };
    ehframe::derive_from_elf_with(data, &opts).map_err(|e| fail(file, 2, e))
}

/// The address `gen` encodes for by default: where `--elf` puts the section, else the
/// page after the highest section.
fn default_section_addr(data: &[u8]) -> u64 {
    if let Ok(plan) = elf_add::plan(data) {
        return plan.sframe_vaddr;
    }
    use object::{Object as _, ObjectSection as _};
    let end = object::File::parse(data)
        .ok()
        .and_then(|f| {
            f.sections()
                .map(|s| s.address().saturating_add(s.size()))
                .max()
        })
        .unwrap_or(0);
    end.checked_add(0xfff).map_or(end, |e| e & !0xfff)
}

/// An encoded section and what was left out.
struct Encoded {
    bytes: Vec<u8>,
    stats: WriteStats,
    /// Rows whose rule the version cannot express, turned into "no rule" ranges.
    dropped_rows: u64,
    dropped_bytes: u64,
    /// Functions left out entirely (PCMASK with an inexpressible row, writer limits).
    dropped_functions: u64,
}

/// Encodes `table`, turning what the version cannot express into "no rule" ranges (the
/// writer then ends the FDE there) and leaving out functions the writer rejects.
fn encode(table: &UnwindTable, version: WriteVersion, addr: u64) -> Result<Encoded, String> {
    let mut cache: HashMap<UnwindRule, bool> = HashMap::new();
    let mut fns = table.to_function_rows();
    let (mut dropped_rows, mut dropped_bytes, mut dropped_functions) = (0u64, 0u64, 0u64);
    fns.retain_mut(|f| {
        let mut lost = false;
        let spans = row_spans(f);
        for (i, row) in f.rows.iter_mut().enumerate() {
            if let Some(rule) = row.rule {
                let ok = *cache
                    .entry(rule)
                    .or_insert_with(|| sframe::stores_rule(table.arch, version, &rule));
                if !ok {
                    row.rule = None;
                    dropped_rows += 1;
                    dropped_bytes += spans.get(i).copied().unwrap_or(0);
                    lost = true;
                }
            }
        }
        if lost && matches!(f.pc_type, PcType::Mask { .. }) {
            dropped_functions += 1;
            return false;
        }
        true
    });
    // The pre-filter covers rules; what remains (per-function consistency, limits) is
    // handled by leaving the function out and trying again, a bounded number of times.
    for _ in 0..256 {
        let t = UnwindTable::from_functions(table.arch, table.source, fns.iter().cloned());
        match write_section(
            &t,
            &WriteOptions {
                version,
                section_vaddr: addr,
            },
        ) {
            Ok((bytes, stats)) => {
                return Ok(Encoded {
                    bytes,
                    stats,
                    dropped_rows,
                    dropped_bytes,
                    dropped_functions,
                });
            }
            Err(e) => {
                let Some(fi) = failing_function(&e) else {
                    return Err(format!("cannot write SFrame: {e}"));
                };
                if fi >= fns.len() {
                    return Err(format!("cannot write SFrame: {e}"));
                }
                fns.remove(fi);
                dropped_functions += 1;
            }
        }
    }
    Err("cannot write SFrame: too many functions the writer rejects".into())
}

fn failing_function(e: &WriteError) -> Option<usize> {
    match *e {
        WriteError::Unrepresentable { function, .. }
        | WriteError::BadRowOrder { function, .. }
        | WriteError::InconsistentFunction { function, .. }
        | WriteError::NoneRowInMaskFunction { function, .. }
        | WriteError::StartOutOfRange { function }
        | WriteError::TooManyRows { function, .. } => Some(function),
        WriteError::TooLarge { .. } => None,
    }
}

/// Code bytes covered by each row of `f` (all repetitions for PCMASK).
fn row_spans(f: &FunctionRows) -> Vec<u64> {
    f.rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let next = f.rows.get(i + 1).map(|n| n.start_offset);
            sframe_user::table::row_ranges(f.size, f.pc_type, r.start_offset, next)
                .map(|(lo, hi)| hi - lo)
                .sum()
        })
        .collect()
}

fn gen_cmd(a: &GenArgs) -> Res<i32> {
    let data = read(&a.file)?;
    let derived = derive(&a.file, &data)?;
    let plan = if a.elf.is_some() {
        Some(elf_add::plan(&data).map_err(|e| fail(&a.file, 2, format!("{e:#}")))?)
    } else {
        None
    };
    let addr = match (&plan, a.section_addr) {
        (Some(p), _) => p.sframe_vaddr,
        (None, Some(addr)) => addr,
        (None, None) => default_section_addr(&data),
    };
    let enc = encode(&derived.table, a.sframe_version, addr).map_err(|e| fail(&a.file, 2, e))?;
    let version = match a.sframe_version {
        WriteVersion::V2 => 2,
        WriteVersion::V3 => 3,
    };
    sframe_user::export::write_file_safely(&a.output, &enc.bytes)
        .map_err(|e| fail(&a.output, 1, format_args!("cannot write: {e}")))?;
    let mut report = format!(
        "{}: wrote {}: SFrame v{version} for address {addr:#x}, {} bytes, {} FDEs, {} FREs \
(source {:?}; {} FDEs converted, {} skipped)\n",
        a.file.display(),
        a.output.display(),
        enc.bytes.len(),
        enc.stats.fdes,
        enc.stats.fres,
        derived.table.source,
        derived.stats.fdes_converted,
        derived.stats.skipped_total(),
    );
    report.push_str(&format!(
        "  left out: {} rows ({} bytes of code) v{version} cannot express, {} functions, \
{} rows without any rule\n",
        enc.dropped_rows,
        enc.dropped_bytes,
        enc.dropped_functions,
        derived.stats.category(RowCategory::NoRule).rows,
    ));
    report.push_str(&categories_line(&derived.stats));
    if let (Some(plan), Some(out_elf)) = (plan, &a.elf) {
        let elf = elf_add::add_sframe(&data, &plan, &enc.bytes)
            .map_err(|e| fail(&a.file, 2, format!("{e:#}")))?;
        // The section must read back at the address its bytes were encoded for.
        let back = Section::from_elf_bytes(&elf)
            .map_err(|e| fail(out_elf, 1, format_args!("internal: added .sframe: {e}")))?;
        if back.section_vaddr() != addr || back.data() != enc.bytes.as_slice() {
            return Err(fail(out_elf, 1, "internal: added .sframe differs"));
        }
        sframe_user::export::write_file_safely(out_elf, &elf)
            .map_err(|e| fail(out_elf, 1, format_args!("cannot write: {e}")))?;
        copy_permissions(&a.file, out_elf);
        report.push_str(&format!(
            "  wrote {} with .sframe at {addr:#x} in a new PT_LOAD segment\n",
            out_elf.display()
        ));
    }
    emit(&report);
    Ok(0)
}

fn copy_permissions(from: &Path, to: &Path) {
    if let Ok(meta) = std::fs::metadata(from) {
        let _ = std::fs::set_permissions(to, meta.permissions());
    }
}

// ---------------------------------------------------------------------------------------
// check

/// A PC range with one rule (or an explicit "no rule").
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    rule: Option<UnwindRule>,
}

/// Most PCMASK blocks expanded per function (a PLT has a few thousand at most).
const MAX_BLOCKS: u64 = 1 << 20;

/// The table as sorted, disjoint spans.
fn spans(table: &UnwindTable) -> Vec<Span> {
    let mut out = Vec::new();
    for f in table.functions() {
        let rows = table.rows(f);
        for (i, r) in rows.clone().enumerate() {
            let next = rows.get(i + 1).map(|n| n.start_offset);
            for (lo, hi) in sframe_user::table::row_ranges(f.size, f.pc_type, r.start_offset, next)
                .take(MAX_BLOCKS as usize)
            {
                out.push(Span {
                    start: f.start.saturating_add(lo),
                    end: f.start.saturating_add(hi),
                    rule: r.rule,
                });
            }
        }
    }
    out.sort_by_key(|s| s.start);
    out
}

/// Whether an SFrame section of `version` can express `rule` (the derived side's row):
/// what the writer stores in v2 and v3 ([`sframe::stores_rule`]); v1 is v2 without
/// zero-word (outermost) rows.
fn expressible(arch: Arch, version: u8, rule: &UnwindRule) -> bool {
    match version {
        1 => !rule.is_outermost() && sframe::stores_rule(arch, WriteVersion::V2, rule),
        2 => sframe::stores_rule(arch, WriteVersion::V2, rule),
        _ => sframe::stores_rule(arch, WriteVersion::V3, rule),
    }
}

/// Rules equal as far as `version` stores them.
fn same(version: u8, sf: &UnwindRule, derived: &UnwindRule) -> bool {
    if sf.is_outermost() || derived.is_outermost() {
        // Zero-word rows store no CFA offset or FP rule.
        return sf.is_outermost() && derived.is_outermost();
    }
    let mask = |r: &UnwindRule| {
        let mut r = *r;
        if version < 3 {
            r.flags = RuleFlags(r.flags.0 & !RuleFlags::SIGNAL);
        }
        r
    };
    mask(sf) == mask(derived)
}

fn fmt_rule(r: &Option<UnwindRule>) -> String {
    r.map_or_else(|| "no rule".into(), |r| r.to_string())
}

#[derive(Default)]
struct CheckResult {
    /// Disagreeing ranges: (start, end, sframe rule, derived rule).
    bad: Vec<(u64, u64, Option<UnwindRule>, Option<UnwindRule>)>,
    bad_bytes: u64,
    compared_bytes: u64,
    /// Both have a row, but the derived one is not expressible in this SFrame version.
    inexpressible_bytes: u64,
    sframe_only_bytes: u64,
}

fn compare(arch: Arch, version: u8, sf: &[Span], dv: &[Span]) -> CheckResult {
    let mut res = CheckResult::default();
    let (mut i, mut j) = (0, 0);
    let mut sf_covered = 0u64;
    while i < sf.len() && j < dv.len() {
        let (a, b) = (&sf[i], &dv[j]);
        let lo = a.start.max(b.start);
        let hi = a.end.min(b.end);
        if lo < hi {
            sf_covered += hi - lo;
            if let (Some(x), Some(y)) = (&a.rule, &b.rule) {
                if !expressible(arch, version, y) {
                    res.inexpressible_bytes += hi - lo;
                } else {
                    res.compared_bytes += hi - lo;
                    if !same(version, x, y) {
                        res.bad_bytes += hi - lo;
                        match res.bad.last_mut() {
                            Some(last) if last.1 == lo && last.2 == a.rule && last.3 == b.rule => {
                                last.1 = hi;
                            }
                            _ => res.bad.push((lo, hi, a.rule, b.rule)),
                        }
                    }
                }
            } else {
                res.inexpressible_bytes += hi - lo;
            }
        }
        if a.end <= b.end {
            i += 1;
        } else {
            j += 1;
        }
    }
    let sf_total: u64 = sf.iter().map(|s| s.end - s.start).sum();
    res.sframe_only_bytes = sf_total.saturating_sub(sf_covered);
    res
}

fn check(a: &CheckArgs) -> Res<i32> {
    let data = read(&a.file)?;
    let file = object::File::parse(&*data).map_err(|e| fail(&a.file, 2, e))?;
    use object::Object as _;
    let name = a.file.display();
    if file.section_by_name(".sframe").is_none() {
        emit(&format!("{name}: no .sframe section; nothing to check\n"));
        return Ok(0);
    }
    if file.section_by_name(".eh_frame").is_none() {
        emit(&format!("{name}: no .eh_frame section; nothing to check\n"));
        return Ok(0);
    }
    let section = Section::from_elf_bytes(&data).map_err(|e| fail(&a.file, 2, e))?;
    let sf_table = section.to_table().map_err(|e| fail(&a.file, 2, e))?;
    // The object's own CFI only: a separate debug file is not what the assembler saw.
    let derived = ehframe::derive_from_elf(&data).map_err(|e| fail(&a.file, 2, e))?;
    let version = section.version();
    let res = compare(
        sf_table.arch,
        version,
        &spans(&sf_table),
        &spans(&derived.table),
    );
    let mut out = String::new();
    for (lo, hi, x, y) in res.bad.iter().take(a.max_report) {
        out.push_str(&format!(
            "{lo:#x}-{hi:#x}: .sframe {} | .eh_frame {}\n",
            fmt_rule(x),
            fmt_rule(y)
        ));
    }
    if res.bad.len() > a.max_report {
        out.push_str(&format!(
            "... {} more ranges\n",
            res.bad.len() - a.max_report
        ));
    }
    out.push_str(&summary(&name.to_string(), version, &res, &derived.stats));
    emit(&out);
    Ok(if res.bad.is_empty() { 0 } else { 1 })
}

/// One line: the derived rows and bytes of code in each [`RowCategory`], how many rows
/// are signal frames or have a signed RA, and the code bytes without any rule.
fn categories_line(stats: &DeriveStats) -> String {
    let mut line = String::from("  rows by kind:");
    for cat in RowCategory::ALL {
        let c = stats.category(cat);
        line.push_str(&format!(" {} {} ({} B),", cat.name(), c.rows, c.bytes));
    }
    line.push_str(&format!(
        " signal {}, mangled RA {}\n",
        stats.signal_rows, stats.mangled_ra_rows,
    ));
    if stats.exec_bytes > 0 {
        line.push_str(&format!(
            "  executable code: {} bytes ({} of padding between functions left out), {} \
with a rule, {} without\n",
            stats.exec_code_bytes(),
            stats.padding_bytes,
            stats.exec_bytes_with_rule,
            stats.exec_bytes_without_rule(),
        ));
    }
    line
}

fn summary(name: &str, version: u8, r: &CheckResult, stats: &DeriveStats) -> String {
    format!(
        "{name}: SFrame v{version} vs .eh_frame: {} ranges ({} bytes) disagree; {} bytes agree; \
not comparable: {} bytes (a rule SFrame v{version} cannot express or no rule), {} bytes \
only in .sframe; {} FDEs converted, {} skipped\n",
        r.bad.len(),
        r.bad_bytes,
        r.compared_bytes - r.bad_bytes,
        r.inexpressible_bytes,
        r.sframe_only_bytes,
        stats.fdes_converted,
        stats.skipped_total(),
    ) + &categories_line(stats)
}
