//! `cargo xtask bench [--quick] [--strict]`: builds `sframe-bench` in release, runs it as
//! root, prints its report and, unless `--quick`, writes it to `BENCHMARKS.md`.
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

pub fn bench(args: BenchArgs) -> Result<()> {
    setup::setup()?;
    let root = cmd::workspace_root();
    let bin = cmd::build_sframe_user_bin("sframe-bench", false)?;
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
        fs::write(&path, report.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: bench: wrote {}", path.display());
    }
    Ok(())
}
