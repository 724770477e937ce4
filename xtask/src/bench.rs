//! `cargo xtask bench [--quick] [--strict]`: builds `sframe-bench` in release, runs it as
//! root, prints its report and, unless `--quick`, writes it to `BENCHMARKS.md`, keeping
//! the notes written there by hand between `<!-- kept -->` and `<!-- /kept -->` lines
//! (each carried to the end of its section in the new report).
//! `cargo xtask test` runs `bench --quick --strict` after the tests, to keep the harness
//! working (its numbers are not asserted).

use std::{fs, process::Stdio};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{cmd, setup};

#[derive(Args)]
pub struct BenchArgs {
    /// Short runs to keep the harness working (CI); BENCHMARKS.md is left as it is.
    #[arg(long)]
    quick: bool,
    /// Fail when a section could not be measured (what CI runs).
    #[arg(long)]
    strict: bool,
}

/// What `cargo xtask test` runs: every section, short, failing on any section that could
/// not be measured.
pub fn quick_check() -> Result<()> {
    bench(BenchArgs {
        quick: true,
        strict: true,
    })
}

/// `cargo xtask stress`: the busy-host load of the bench (compile churn, spinners,
/// python3) plus CPU hogs, for a while; run `cargo xtask test` beside it to check the
/// suite holds on a loaded machine.
#[derive(Args)]
pub struct StressArgs {
    /// Seconds to run (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
    /// CPU hogs beside the load (default: one per CPU).
    #[arg(long)]
    hogs: Option<usize>,
}

pub fn stress(args: StressArgs) -> Result<()> {
    setup::setup()?;
    let bin = cmd::build_sframe_user_bin("sframe-bench", false)?;
    let mut run = std::process::Command::new(&bin);
    run.args(["--stress", &args.seconds.to_string()]);
    if let Some(h) = args.hogs {
        run.args(["--hogs", &h.to_string()]);
    }
    cmd::run(&mut run, "stress")
}

pub fn bench(args: BenchArgs) -> Result<()> {
    setup::setup()?;
    let root = cmd::workspace_root();
    let bin = cmd::build_sframe_user_bin("sframe-bench", false)?;
    // The busy-host section runs the profiler as users do.
    cmd::build_sframe_user_bin("sframe-user", false)?;
    let mut run = cmd::privileged(&bin.to_string_lossy());
    if args.quick {
        run.arg("--quick");
    }
    if args.strict {
        run.arg("--strict");
    }
    eprintln!("xtask: bench: {}", cmd::display(&run));
    let out = run
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {}", cmd::display(&run)))?;
    let mut report = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        print!("{report}");
        bail!("sframe-bench failed ({})", out.status);
    }
    let started = std::time::Instant::now();
    report += &crate::fleet::whole_system_table(args.quick)?;
    eprintln!(
        "xtask: bench: whole-system table took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if !args.quick {
        // `cargo xtask test` runs the matrix itself; the full bench records it.
        let started = std::time::Instant::now();
        report += &crate::vm::bench_section()?;
        eprintln!(
            "xtask: bench: kernel matrix took {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    print!("{report}");
    if !args.quick {
        let path = root.join("BENCHMARKS.md");
        // Notes written by hand after earlier runs (between KEPT_OPEN and KEPT_CLOSE) are
        // carried over: the report is regenerated, the record of what was measured is not.
        let report = match fs::read_to_string(&path) {
            Ok(old) => carry_kept_notes(&old, &report),
            Err(_) => report,
        };
        fs::write(&path, report.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: bench: wrote {}", path.display());
    }
    Ok(())
}

/// Opens a note written by hand in BENCHMARKS.md, which a full bench keeps.
const KEPT_OPEN: &str = "<!-- kept -->";
/// Closes it.
const KEPT_CLOSE: &str = "<!-- /kept -->";

/// `new` with the kept notes of `old` (each block from a [`KEPT_OPEN`] line to its
/// [`KEPT_CLOSE`] line, markers included) at the end of the section of `new` whose
/// heading line is the one the block was under in `old`, in their order. Blocks whose
/// heading `new` does not have (a section renamed or gone) go to the end, under a copy
/// of that heading. An unclosed block runs to the end of `old`.
fn carry_kept_notes(old: &str, new: &str) -> String {
    let blocks = kept_blocks(old);
    let headings = headings(new);
    let mut out = String::with_capacity(new.len() + old.len());
    let put = |out: &mut String, section: &str| {
        for (_, block) in blocks.iter().filter(|(h, _)| h == section) {
            if !out.ends_with("\n\n") {
                out.push('\n');
            }
            out.push_str(block);
            out.push('\n');
        }
    };
    let mut section = "";
    for (line, heading) in new.lines().zip(&headings) {
        if *heading != section {
            put(&mut out, section);
            section = heading;
        }
        out.push_str(line);
        out.push('\n');
    }
    put(&mut out, section);
    let orphans: Vec<&(String, String)> = blocks
        .iter()
        .filter(|(h, _)| !headings.contains(&h.as_str()))
        .collect();
    if !orphans.is_empty() {
        out.push_str("\n# Notes kept from earlier reports whose section is gone\n");
        let mut last: Option<&str> = None;
        for (h, block) in orphans {
            if last != Some(h.as_str()) {
                // The heading as it was, so that the next report finds it again.
                out.push_str(&format!("\n{h}\n\n"));
                last = Some(h);
            }
            out.push_str(block);
        }
    }
    out
}

/// For each line of `doc`, the heading line it is under ("" before the first). Lines
/// of fenced code blocks are never headings (a `#` comment in a listing is not one).
fn headings(doc: &str) -> Vec<&str> {
    let (mut heading, mut fenced) = ("", false);
    doc.lines()
        .map(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
            } else if !fenced && line.starts_with('#') {
                heading = line;
            }
            heading
        })
        .collect()
}

/// The kept blocks of `doc` (markers included, a missing close supplied), each with the
/// heading line it is under.
fn kept_blocks(doc: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, String)> = None;
    for (line, heading) in doc.lines().zip(headings(doc)) {
        match open.as_mut() {
            Some((_, block)) => {
                block.push_str(line);
                block.push('\n');
                if line.trim() == KEPT_CLOSE
                    && let Some((h, block)) = open.take()
                {
                    blocks.push((h.to_owned(), block));
                }
            }
            None if line.trim() == KEPT_OPEN => open = Some((heading, format!("{line}\n"))),
            None => {}
        }
    }
    if let Some((h, block)) = open {
        blocks.push((h.to_owned(), format!("{block}{KEPT_CLOSE}\n")));
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_notes_follow_their_section_and_the_rest_is_regenerated() {
        let old = "# B\n\n## 1. Cost\n\nold table\n\n<!-- kept -->\nMeasured by hand.\n<!-- /kept -->\n\n## 2. Gone\n\n<!-- kept -->\nOrphan.\n<!-- /kept -->\n\n## 3. Last\n\n<!-- kept -->\nTail.\n";
        let new = "# B\n\n## 1. Cost\n\nnew table\n\n## 3. Last\n\nnew last\n";
        let out = carry_kept_notes(old, new);
        assert!(!out.contains("old table"));
        let cost = out.find("new table").unwrap();
        let hand = out.find("Measured by hand.").unwrap();
        let last = out.find("## 3. Last").unwrap();
        assert!(cost < hand && hand < last, "{out}");
        let tail = out.find("Tail.").unwrap();
        assert!(out.find("new last").unwrap() < tail);
        let orphan = out.find("Orphan.").unwrap();
        assert!(out.find("whose section is gone").unwrap() < orphan);
        assert!(out.find("## 2. Gone").unwrap() < orphan);
        assert_eq!(out.matches(KEPT_OPEN).count(), 3);
        assert_eq!(out.matches(KEPT_CLOSE).count(), 3);
        // Carrying twice changes nothing more.
        assert_eq!(carry_kept_notes(&out, new), out);
    }

    /// A `#` line of a code listing is not a heading: a note after the listing stays in
    /// the listing's section.
    #[test]
    fn fenced_lines_are_not_headings() {
        let old =
            "## 7. Off CPU\n\n```\n# a comment\n```\n\n<!-- kept -->\nNote.\n<!-- /kept -->\n";
        let new = "## 7. Off CPU\n\n```\n# another listing\n```\n\n## 8. Next\n";
        let out = carry_kept_notes(old, new);
        let note = out.find("Note.").unwrap();
        assert!(note < out.find("## 8. Next").unwrap(), "{out}");
        assert!(!out.contains("whose section is gone"), "{out}");
    }

    /// The project's own BENCHMARKS.md: regenerated without its kept notes, it gets every
    /// one back, none orphaned.
    #[test]
    fn benchmarks_md_keeps_its_notes_through_a_regeneration() {
        let path = crate::cmd::workspace_root().join("BENCHMARKS.md");
        let old = std::fs::read_to_string(path).unwrap();
        let mut stripped = String::new();
        let mut inside = false;
        for line in old.lines() {
            match line.trim() {
                KEPT_OPEN => inside = true,
                KEPT_CLOSE => inside = false,
                _ if !inside => {
                    stripped.push_str(line);
                    stripped.push('\n');
                }
                _ => {}
            }
        }
        let kept = old.matches(KEPT_OPEN).count();
        assert!(kept >= 6, "{kept} kept notes");
        let out = carry_kept_notes(&old, &stripped);
        assert_eq!(out.matches(KEPT_OPEN).count(), kept);
        assert!(!out.contains("whose section is gone"));
        assert!(out.contains("**The suite under load.**"));
    }
}
