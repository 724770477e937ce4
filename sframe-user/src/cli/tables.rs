//! Subcommands that inspect and produce unwind tables of files: `dump`, `lookup`,
//! `check`, `gen`.
//!
//! Exit status: 0 on success, 1 when `check` finds a disagreement (or an output file
//! cannot be written), 2 when the input cannot be read or is malformed; errors are one
//! line on stderr naming the file, the check that failed and the offset.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use sframe_common::UnwindRule;
use sframe_user::ehframe::{self, DeriveOptions, DeriveStats, RowCategory};
use sframe_user::sframe::{self, Abi, Section, WriteVersion, dump_to_string, lookup_line};

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
        let enc = encode(&a.file, &derived.table, a.sframe_version, addr)?;
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
        encoded = encode(&a.file, &derived.table, WriteVersion::V3, addr)?;
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

/// What `version` can store of `table`, as a section for `addr`.
fn encode(
    file: &Path,
    table: &sframe_user::table::UnwindTable,
    version: WriteVersion,
    addr: u64,
) -> Res<sframe::StorableSection> {
    sframe::write_storable(table, version, addr)
        .map_err(|e| fail(file, 2, format_args!("cannot write SFrame: {e}")))
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
    let enc = encode(&a.file, &derived.table, a.sframe_version, addr)?;
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

fn fmt_rule(r: &UnwindRule) -> String {
    r.to_string()
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
    let res = sframe::compare_tables(&sf_table, version, &derived.table);
    let mut out = String::new();
    for d in res.disagreements.iter().take(a.max_report) {
        out.push_str(&format!(
            "{:#x}-{:#x}: .sframe {} | .eh_frame {}\n",
            d.start,
            d.end,
            fmt_rule(&d.sframe),
            fmt_rule(&d.derived)
        ));
    }
    if res.disagreements.len() > a.max_report {
        out.push_str(&format!(
            "... {} more ranges\n",
            res.disagreements.len() - a.max_report
        ));
    }
    out.push_str(&summary(&name.to_string(), version, &res, &derived.stats));
    emit(&out);
    Ok(if res.disagreements.is_empty() { 0 } else { 1 })
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

fn summary(name: &str, version: u8, r: &sframe::Comparison, stats: &DeriveStats) -> String {
    format!(
        "{name}: SFrame v{version} vs .eh_frame: {} ranges ({} bytes) disagree; {} bytes agree; \
not comparable: {} bytes (a rule SFrame v{version} cannot express or no rule), {} bytes \
only in .sframe; {} FDEs converted, {} skipped\n",
        r.disagreements.len(),
        r.disagreeing_bytes,
        r.compared_bytes - r.disagreeing_bytes,
        r.not_comparable_bytes,
        r.sframe_only_bytes,
        stats.fdes_converted,
        stats.skipped_total(),
    ) + &categories_line(stats)
}
