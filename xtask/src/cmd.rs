//! Small helpers for running commands with clear failure messages.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `target/` of the
/// workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds binary `bin` of `sframe-user` (release unless `debug`) and returns its path
/// under the target directory.
pub fn build_sframe_user_bin(bin: &str, debug: bool) -> Result<PathBuf> {
    let mut build = Command::new("cargo");
    build
        .current_dir(workspace_root())
        .args(["build", "--package", "sframe-user", "--bin", bin]);
    if !debug {
        build.arg("--release");
    }
    run(&mut build, &format!("build {bin}"))?;
    let profile = if debug { "debug" } else { "release" };
    Ok(target_dir().join(profile).join(bin))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions. Avoid a libc dependency: read /proc instead.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Runs `cmd`, inheriting stdio; fails with `what` and the command line on error.
pub fn run(cmd: &mut Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}: {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {}", display(cmd)))?;
    if !status.success() {
        bail!("{what} failed ({status}): {}", display(cmd));
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout, or `None` if it could not run or failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// A command that runs as root: directly when we are root, else through `sudo -E`.
pub fn privileged(program: &str) -> Command {
    if is_root() {
        Command::new(program)
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg("-E").arg(program);
        cmd
    }
}
