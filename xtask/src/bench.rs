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
        fs::write(&path, report.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: bench: wrote {}", path.display());
    }
    Ok(())
}
