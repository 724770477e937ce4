//! `cargo xtask fuzz [--seconds N] [--target NAME]`: builds the seed corpora and runs the
//! cargo-fuzz targets of `fuzz/` for a bounded time each. `cargo xtask test` calls
//! [`run_all`] after the tests.
//!
//! Corpora (generated, not committed) live in `fuzz/corpus/<target>`:
//! - `sframe_read`: by `fuzz/make-corpus.sh` (the SFrame vectors in
//!   `../shared/sframe-vectors` and `.sframe` sections of gcc `-Wa,--gsframe` builds);
//! - `procfs_maps`: this process's `/proc/self/maps` and hand-made hostile lines;
//! - `ehframe_derive`: ELF files, gcc builds of a small program (with and without
//!   `--gsframe`, executable and shared object) and small system libraries (ld.so,
//!   libgcc_s, libc).
//!
//! A crash fails the run; the crashing input (`fuzz/artifacts/<target>/`) is printed
//! and should become a regression test.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::cmd;

/// Every fuzz target of `fuzz/`.
pub const TARGETS: &[&str] = &["sframe_read", "ehframe_derive", "procfs_maps", "walk"];

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Run only this target (default: all).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(TARGETS))]
    target: Option<String>,
}

pub fn fuzz(args: FuzzArgs) -> Result<()> {
    crate::setup::setup()?;
    let targets: Vec<&str> = match &args.target {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    run_targets(&targets, args.seconds)
}

/// Runs every target for `seconds` each.
pub fn run_all(seconds: u64) -> Result<()> {
    run_targets(TARGETS, seconds)
}

fn run_targets(targets: &[&str], seconds: u64) -> Result<()> {
    let fuzz_dir = cmd::workspace_root().join("fuzz");
    let mut failed = Vec::new();
    for target in targets {
        let corpus = fuzz_dir.join("corpus").join(target);
        build_corpus(&fuzz_dir, target, &corpus)
            .with_context(|| format!("building the seed corpus of {target}"))?;
        let started = std::time::Instant::now();
        let artifacts = fuzz_dir.join("artifacts").join(target);
        let before = list(&artifacts);
        let mut run = Command::new("cargo");
        run.current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", target])
            .arg(&corpus)
            .args(["--", &format!("-max_total_time={seconds}")])
            // Keep libFuzzer's per-input limits reasonable for multi-MB seeds.
            .arg("-rss_limit_mb=4096")
            .arg("-timeout=60");
        let result = cmd::run(&mut run, &format!("fuzz {target} for {seconds} s"));
        eprintln!(
            "xtask: fuzz {target}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
        if let Err(err) = result {
            let new: Vec<PathBuf> = list(&artifacts)
                .into_iter()
                .filter(|p| !before.contains(p))
                .collect();
            for p in &new {
                print_crash(p);
            }
            failed.push(format!("{target}: {err:#}"));
        }
    }
    if !failed.is_empty() {
        bail!("fuzzing found crashes:\n{}", failed.join("\n"));
    }
    Ok(())
}

fn list(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Prints a crash input: its path and a hex dump of its first 4 KiB.
fn print_crash(path: &Path) {
    let data = std::fs::read(path).unwrap_or_default();
    eprintln!(
        "xtask: crash input {} ({} bytes):",
        path.display(),
        data.len()
    );
    for (i, chunk) in data.chunks(32).take(128).enumerate() {
        let hex: String = chunk.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!("  {:06x}: {hex}", i * 32);
    }
    eprintln!(
        "xtask: reproduce with: cd fuzz && cargo +nightly fuzz run <target> {}",
        path.display()
    );
}

fn build_corpus(fuzz_dir: &Path, target: &str, corpus: &Path) -> Result<()> {
    std::fs::create_dir_all(corpus).with_context(|| format!("creating {}", corpus.display()))?;
    match target {
        "sframe_read" => cmd::run(
            Command::new("sh").arg(fuzz_dir.join("make-corpus.sh")),
            "seed corpus for sframe_read",
        ),
        "ehframe_derive" => elf_corpus(corpus),
        "procfs_maps" => maps_corpus(corpus),
        _ => Ok(()),
    }
}

/// Maps seeds: our own maps and lines with the paths a hostile process can choose.
fn maps_corpus(corpus: &Path) -> Result<()> {
    std::fs::write(corpus.join("self"), std::fs::read("/proc/self/maps")?)?;
    let line = |path: &[u8]| {
        let mut l = b"7f0000000000-7f0000001000 r-xp 00001000 fe:01 1835019   ".to_vec();
        l.extend_from_slice(path);
        l.push(b'\n');
        l
    };
    std::fs::write(corpus.join("invalid-utf8"), line(b"/tmp/vict\xff"))?;
    std::fs::write(corpus.join("spaces"), line(b"/tmp/a b  c (deleted)"))?;
    std::fs::write(corpus.join("pseudo"), line(b"[vdso]"))?;
    Ok(())
}

const SEED_C: &str = r#"
#include <alloca.h>
#include <stdio.h>
#include <string.h>
__attribute__((noinline)) int use_alloca(int n) { char *p = alloca(n); memset(p, 1, n); return p[n - 1]; }
__attribute__((noinline, force_align_arg_pointer)) int realign(int n) { return n + puts("x"); }
int main(int argc, char **argv) { return use_alloca(argc + 8) + realign(argc) + (int)strlen(argv[0]); }
"#;

/// ELF seeds: gcc builds (when gcc works) and small system libraries.
fn elf_corpus(corpus: &Path) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("xtask-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let src = tmp.join("seed.c");
    std::fs::write(&src, SEED_C)?;
    let builds: [(&str, &[&str]); 5] = [
        ("gcc-O0-sframe", &["-O0", "-Wa,--gsframe"]),
        ("gcc-O2-sframe", &["-O2", "-Wa,--gsframe"]),
        ("gcc-O2", &["-O2"]),
        ("gcc-O2-omitfp", &["-O2", "-fomit-frame-pointer"]),
        (
            "gcc-shared-sframe",
            &["-O2", "-fPIC", "-shared", "-Wa,--gsframe"],
        ),
    ];
    for (name, flags) in builds {
        let out = corpus.join(name);
        let ok = Command::new("gcc")
            .args(flags)
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("xtask: seed {name}: gcc failed, skipped");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    for lib in [
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "/lib/x86_64-linux-gnu/libc.so.6",
    ] {
        let p = Path::new(lib);
        if let (Ok(data), Some(name)) = (std::fs::read(p), p.file_name()) {
            std::fs::write(corpus.join(name), data)?;
        }
    }
    Ok(())
}
