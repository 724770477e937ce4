//! `cargo xtask vm-test`: the kernel matrix. Boots Debian's own kernel packages under
//! qemu with an initramfs that holds the release `sframe-user`, the fixtures, their
//! libraries and this binary as the test runner (`xtask vm-guest`, see `guest`), and
//! runs the same tests on the host's kernel. Reports per kernel: pass/fail per test and
//! the verifier's instruction count per program.

mod cpio;
mod fixtures;
pub mod guest;
mod kernels;
mod qemu;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};

use crate::cmd;
use kernels::{Kernel, KernelSource};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arch {
    #[value(name = "x86_64")]
    X86_64,
    #[value(name = "aarch64")]
    Aarch64,
}

impl Arch {
    pub fn host() -> Self {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }
    fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
    /// Rust's target triple.
    fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }
    /// Debian's name of the architecture.
    fn deb_arch(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }
    /// Debian's multiarch library directory name.
    fn multiarch(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Aarch64 => "aarch64-linux-gnu",
        }
    }
}

/// `cargo xtask build [--arch A]`: the release `sframe-user` (with its BPF object built
/// for that architecture's registers), cross-compiled for another architecture.
#[derive(Args)]
pub struct BuildArgs {
    #[arg(long, value_enum, default_value = "x86_64")]
    arch: Arch,
}

pub fn build(args: BuildArgs) -> Result<()> {
    crate::setup::setup()?;
    if args.arch != Arch::host() {
        crate::setup::ensure_vm_packages(args.arch)?;
    }
    let bin = build_for(args.arch, "sframe-user", "sframe-user", true)?;
    println!("{}", bin.display());
    Ok(())
}

/// `bin` of `package` built for `arch` (release for the profiler, debug for the
/// runner), cross-compiled when `arch` is not the host's.
fn build_for(arch: Arch, package: &str, bin: &str, release: bool) -> Result<PathBuf> {
    if arch == Arch::host() && package == "sframe-user" {
        return cmd::build_sframe_user_bin(bin, !release);
    }
    if arch == Arch::host() {
        return std::env::current_exe().context("the xtask binary's path");
    }
    let mut build = Command::new("cargo");
    build
        .current_dir(cmd::workspace_root())
        .args(["build", "--package", package, "--bin", bin])
        .args(["--target", arch.rust_target()]);
    if release {
        build.arg("--release");
    }
    cmd::run(&mut build, &format!("build {bin} for {}", arch.name()))?;
    Ok(cmd::target_dir()
        .join(arch.rust_target())
        .join(if release { "release" } else { "debug" })
        .join(bin))
}

#[derive(Args)]
pub struct VmTestArgs {
    /// The guests' architecture.
    #[arg(long, value_enum, default_value = "x86_64")]
    arch: Arch,
    /// Only these kernels of the matrix (`6.1`, `6.12`, `host`; `5.10`, not in the
    /// default matrix, only when named); default: the matrix.
    #[arg(long)]
    kernel: Vec<String>,
    /// Only the tests whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Workload CPU seconds each test profiles.
    #[arg(long, default_value_t = 2.0)]
    cpu_seconds: f64,
}

impl VmTestArgs {
    /// The whole matrix of `arch`.
    pub fn for_arch(arch: Arch) -> Self {
        Self {
            arch,
            ..Self::default()
        }
    }
}

impl Default for VmTestArgs {
    fn default() -> Self {
        Self {
            arch: Arch::X86_64,
            kernel: Vec::new(),
            only: None,
            cpu_seconds: 2.0,
        }
    }
}

/// Wall-clock limit of one guest boot and its tests (TCG runs them several times slower
/// than the host).
const GUEST_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// What one kernel of the matrix gave.
struct KernelResult {
    name: String,
    release: String,
    /// test → (status, seconds, detail)
    tests: BTreeMap<String, (String, String, String)>,
    /// program → verified instructions
    verifier: BTreeMap<String, String>,
    /// workload → the `profile` program's mean run time (ns, bpf_stats)
    cost: BTreeMap<String, String>,
    /// test → the lines of its failure message
    details: BTreeMap<String, Vec<String>>,
    /// Set when the kernel could not be run at all.
    error: Option<String>,
    seconds: f64,
}

impl KernelResult {
    /// Failed: not run, a test failed, or (under CI, which must run every check) a
    /// test was skipped.
    fn failed(&self) -> bool {
        let ci = std::env::var_os("CI").is_some_and(|v| v == "true");
        self.error.is_some()
            || self.tests.is_empty()
            || self
                .tests
                .values()
                .any(|(s, _, _)| s == "fail" || (ci && s == "skip"))
    }
}

pub fn vm_test(args: VmTestArgs) -> Result<()> {
    let (_, failed) = run_matrix(args)?;
    if !failed.is_empty() {
        bail!("the VM matrix failed on kernel(s) {}", failed.join(", "));
    }
    Ok(())
}

/// The section `cargo xtask bench` adds to BENCHMARKS.md: the whole matrix, with its
/// method. A failing kernel is reported in the table, not an error here.
pub fn bench_section() -> Result<String> {
    let mut s = String::from(BENCH_METHOD);
    for arch in [Arch::X86_64, Arch::Aarch64] {
        let (report, failed) = run_matrix(VmTestArgs::for_arch(arch))?;
        s.push_str(&report);
        if !failed.is_empty() {
            let _ = writeln!(s, "\n**Failed on: {}**", failed.join(", "));
        }
        s.push('\n');
    }
    Ok(s)
}

const BENCH_METHOD: &str = "\n# Kernel matrix\n\n\
Method: `cargo xtask vm-test` (see ARCHITECTURE.md, \"Kernel matrix\"): Debian's kernel \
packages booted under qemu with the release profiler, and the same tests on this \
machine's kernel. The verifier counts come from `sframe-user check-kernel` (each \
program loaded, not attached); goal: at most 50 % of the 1,000,000-instruction limit \
on every kernel. The 6.1 verifier explores more states than later ones for the same \
program (it prunes less), which is why its count is the highest. The run-time column \
is the kernel's `bpf_stats` for the `profile` program during the C workloads: under \
TCG every instruction is emulated and one run differs from the next by up to 1.5x, so \
the guests' figures show that the walk runs there, not how fast; the host's column is \
comparable with section 1.\n\n";

/// Runs the matrix; returns the rendered report and the kernels that failed.
fn run_matrix(args: VmTestArgs) -> Result<(String, Vec<String>)> {
    crate::setup::setup()?;
    crate::setup::ensure_vm_packages(args.arch)?;
    let started = Instant::now();
    let matrix = match args.arch {
        Arch::X86_64 => kernels::x86_64_matrix(),
        Arch::Aarch64 => kernels::aarch64_matrix(),
    };
    let on_request = kernels::on_request(match args.arch {
        Arch::X86_64 => "amd64",
        Arch::Aarch64 => "arm64",
    });
    let matrix: Vec<Kernel> = matrix
        .into_iter()
        .filter(|k| args.kernel.is_empty() || args.kernel.contains(&k.name))
        .chain(
            on_request
                .into_iter()
                .filter(|k| args.kernel.contains(&k.name)),
        )
        .collect();
    if matrix.is_empty() {
        bail!("no kernel of the matrix matches {:?}", args.kernel);
    }
    let profiler = build_for(args.arch, "sframe-user", "sframe-user", true)?;
    let runner = build_for(args.arch, "xtask", "xtask", false)?;
    let base = cmd::target_dir().join("vm").join(args.arch.name());
    let fx = fixtures::build(args.arch, &base.join("fixtures"))?;
    let mut guest_args = vec![format!("--cpu-seconds={}", args.cpu_seconds)];
    if let Some(o) = &args.only {
        guest_args.push(format!("--only={o}"));
    }
    // Debian kernels: fetched one after the other (apt), then booted side by side (each
    // qemu is one host thread); the host kernel's run comes last, on a quiet machine.
    let mut initrd: Option<PathBuf> = None;
    let mut prepared: Vec<(usize, Result<PathBuf>)> = Vec::new();
    for (i, k) in matrix.iter().enumerate() {
        let KernelSource::Debian {
            prefix,
            suffix,
            apt,
        } = &k.source
        else {
            continue;
        };
        let image = (|| -> Result<PathBuf> {
            let package = kernels::resolve(prefix, suffix, *apt)?;
            eprintln!("xtask: vm: kernel {} is {package}", k.name);
            kernels::fetch(
                &package,
                *apt,
                &cmd::target_dir().join("vm").join("kernels"),
            )
        })();
        if image.is_ok() && initrd.is_none() {
            let p = base.join("initrd.cpio");
            build_initramfs(args.arch, &p, &runner, &profiler, &fx, &guest_args)?;
            initrd = Some(p);
        }
        prepared.push((i, image));
    }
    let mut results: Vec<Option<KernelResult>> = matrix.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = prepared
            .into_iter()
            .map(|(i, image)| {
                let k = &matrix[i];
                let initrd = initrd.clone();
                let base = &base;
                let arch = args.arch;
                scope.spawn(move || {
                    let t = Instant::now();
                    let lines = image.and_then(|image| {
                        let initrd = initrd.context("no initramfs")?;
                        let log = base.join(format!("console-{}.log", k.name));
                        qemu::boot(arch, &image, &initrd, &log, GUEST_TIMEOUT)
                    });
                    (i, result_of(&k.name, lines, t))
                })
            })
            .collect();
        for h in handles {
            if let Ok((i, r)) = h.join() {
                results[i] = Some(r);
            }
        }
    });
    for (i, k) in matrix.iter().enumerate() {
        if let KernelSource::Host = k.source {
            let t = Instant::now();
            let lines = run_on_host(&runner, &profiler, &fx.dir, &guest_args, &base);
            results[i] = Some(result_of(&k.name, lines, t));
        }
    }
    let results: Vec<KernelResult> = results
        .into_iter()
        .zip(&matrix)
        .map(|(r, k)| {
            r.unwrap_or_else(|| result_of(&k.name, Err(anyhow::anyhow!("not run")), Instant::now()))
        })
        .collect();
    let report = render(args.arch, &results, started.elapsed());
    let path = base.join("report.md");
    std::fs::write(&path, &report)?;
    eprintln!("{report}");
    eprintln!("xtask: vm: report in {}", path.display());
    let failed: Vec<String> = results
        .iter()
        .filter(|r| r.failed())
        .map(|r| r.name.clone())
        .collect();
    Ok((report, failed))
}

/// The host kernel's row: the same runner, run directly.
fn run_on_host(
    runner: &Path,
    profiler: &Path,
    fixtures: &Path,
    guest_args: &[String],
    base: &Path,
) -> Result<Vec<String>> {
    let out = Command::new(runner)
        .arg("vm-guest")
        .arg("--profiler")
        .arg(profiler)
        .arg("--fixtures")
        .arg(fixtures)
        .args(guest_args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running the VM tests on the host kernel")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    std::fs::write(base.join("console-host.log"), &text)?;
    Ok(text.lines().map(str::to_owned).collect())
}

fn result_of(name: &str, lines: Result<Vec<String>>, started: Instant) -> KernelResult {
    let mut r = match lines {
        Ok(lines) => parse(name, &lines),
        Err(err) => KernelResult {
            name: name.to_owned(),
            release: String::new(),
            tests: BTreeMap::new(),
            verifier: BTreeMap::new(),
            cost: BTreeMap::new(),
            details: BTreeMap::new(),
            error: Some(format!("{err:#}")),
            seconds: 0.0,
        },
    };
    r.seconds = started.elapsed().as_secs_f64();
    r
}

fn parse(name: &str, lines: &[String]) -> KernelResult {
    let mut r = KernelResult {
        name: name.to_owned(),
        release: String::new(),
        tests: BTreeMap::new(),
        verifier: BTreeMap::new(),
        cost: BTreeMap::new(),
        details: BTreeMap::new(),
        error: None,
        seconds: 0.0,
    };
    let mut done = false;
    for line in lines {
        let Some(rest) = line.split_once(guest::TAG).map(|x| x.1.trim()) else {
            continue;
        };
        let f: Vec<&str> = rest.splitn(5, ' ').collect();
        match f.as_slice() {
            ["kernel", release, ..] => r.release = (*release).to_owned(),
            ["verifier", prog, n, ..] => {
                r.verifier.insert((*prog).to_owned(), (*n).to_owned());
            }
            ["cost", workload, ns, ..] => {
                r.cost.insert((*workload).to_owned(), (*ns).to_owned());
            }
            ["test", test, status, secs, detail @ ..] => {
                r.tests.insert(
                    (*test).to_owned(),
                    (
                        (*status).to_owned(),
                        (*secs).to_owned(),
                        detail.first().copied().unwrap_or("").to_owned(),
                    ),
                );
            }
            ["detail", test, ..] => {
                // A failing test's whole message (its first line is in the test line).
                let text = rest.split_once(": ").map_or("", |x| x.1);
                r.details
                    .entry(test.trim_end_matches(':').to_owned())
                    .or_default()
                    .push(text.to_owned());
            }
            ["tests", "done,", ..] => done = true,
            _ => {}
        }
    }
    if !done {
        r.error = Some("the test runner did not finish (see the console log)".into());
    }
    r
}

fn render(arch: Arch, results: &[KernelResult], took: Duration) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## VM matrix ({}, {}; {:.0} s)\n",
        arch.name(),
        qemu::accel_note(),
        took.as_secs_f64()
    );
    let tests: Vec<&String> = {
        let mut v: Vec<&String> = results.iter().flat_map(|r| r.tests.keys()).collect();
        v.sort();
        v.dedup();
        v
    };
    let _ = write!(s, "| kernel | release | time |");
    for t in &tests {
        let _ = write!(s, " {t} |");
    }
    let _ = writeln!(s);
    let _ = write!(s, "|---|---|---|");
    for _ in &tests {
        let _ = write!(s, "---|");
    }
    let _ = writeln!(s);
    for r in results {
        let _ = write!(s, "| {} | {} | {:.0} s |", r.name, r.release, r.seconds);
        for t in &tests {
            let cell = r.tests.get(*t).map(|(st, _, _)| st.as_str()).unwrap_or("—");
            let _ = write!(s, " {cell} |");
        }
        let _ = writeln!(s);
    }
    let verifier: Vec<&BTreeMap<String, String>> = results.iter().map(|r| &r.verifier).collect();
    per_kernel_table(
        &mut s,
        results,
        "Verifier instructions per program (limit 1,000,000):",
        "program",
        &verifier,
    );
    let cost: Vec<&BTreeMap<String, String>> = results.iter().map(|r| &r.cost).collect();
    per_kernel_table(
        &mut s,
        results,
        "Mean run time of the `profile` program, ns (bpf_stats; every sample of both CPUs, \
         the workload's walks and the cheap exits for other tasks; guests are emulated: \
         their figures vary by up to 1.5x from run to run):",
        "workload",
        &cost,
    );
    let _ = writeln!(s, "\nDetails:\n");
    for r in results {
        if let Some(e) = &r.error {
            let _ = writeln!(s, "- {}: ERROR {}", r.name, e.lines().next().unwrap_or(""));
            for l in e.lines().skip(1).take(40) {
                let _ = writeln!(s, "  {l}");
            }
        }
        for (t, (st, secs, detail)) in &r.tests {
            let _ = writeln!(s, "- {} {t}: {st} ({secs}) {detail}", r.name);
            if st == "fail" {
                for l in r.details.get(t).into_iter().flatten().skip(1).take(40) {
                    let _ = writeln!(s, "  {l}");
                }
            }
        }
    }
    s
}

/// A table with one row per key of `columns` (one map per kernel) and one column per
/// kernel; nothing when no kernel has a value.
fn per_kernel_table(
    s: &mut String,
    results: &[KernelResult],
    title: &str,
    what: &str,
    columns: &[&BTreeMap<String, String>],
) {
    let mut keys: Vec<&String> = columns.iter().flat_map(|c| c.keys()).collect();
    keys.sort();
    keys.dedup();
    if keys.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n{title}\n");
    let _ = write!(s, "| {what} |");
    for r in results {
        let _ = write!(s, " {} |", r.name);
    }
    let _ = writeln!(s);
    let _ = write!(s, "|---|");
    for _ in results {
        let _ = write!(s, "---:|");
    }
    let _ = writeln!(s);
    for k in keys {
        let _ = write!(s, "| {k} |");
        for c in columns {
            let _ = write!(s, " {} |", c.get(k).map(String::as_str).unwrap_or("—"));
        }
        let _ = writeln!(s);
    }
}

/// Shared libraries `elf` needs: as `ldd` resolves them for the host's architecture;
/// for another, its interpreter and `DT_NEEDED` entries (recursively, by `readelf`)
/// found in Debian's multiarch directories of that architecture.
fn libraries(arch: Arch, elf: &Path) -> Result<Vec<PathBuf>> {
    if arch != Arch::host() {
        return foreign_libraries(arch, elf);
    }
    let out = Command::new("ldd")
        .arg(elf)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, r)) => r.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn foreign_libraries(arch: Arch, elf: &Path) -> Result<Vec<PathBuf>> {
    foreign_libraries_in(arch, elf, None)
}

/// The libraries `elf` needs, found in the host's directories of `arch` (multiarch)
/// and, first, under `root` (packages unpacked there).
fn foreign_libraries_in(arch: Arch, elf: &Path, root: Option<&Path>) -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    if let Some(root) = root {
        dirs.push(root.join("lib").join(arch.multiarch()));
        dirs.push(root.join("usr/lib").join(arch.multiarch()));
    }
    dirs.push(PathBuf::from("/lib").join(arch.multiarch()));
    dirs.push(PathBuf::from("/usr/lib").join(arch.multiarch()));
    let mut out: Vec<PathBuf> = Vec::new();
    let mut todo = vec![elf.to_owned()];
    while let Some(f) = todo.pop() {
        let text = cmd::output(Command::new("readelf").args(["-d", "-l", "-W"]).arg(&f))
            .with_context(|| format!("readelf {}", f.display()))?;
        for line in text.lines() {
            if let Some(i) = line.find("Requesting program interpreter: ") {
                let p = PathBuf::from(line[i + 32..].trim_end_matches(']').trim());
                if !out.contains(&p) {
                    out.push(p);
                }
            }
            if line.contains("(NEEDED)")
                && let Some(name) = line.split('[').nth(1).map(|r| r.trim_end_matches(']'))
            {
                // The fixtures find their own libraries through `$ORIGIN`.
                let origin = f.parent().map(Path::to_path_buf);
                let Some(p) = dirs
                    .iter()
                    .chain(origin.iter())
                    .map(|d| d.join(name))
                    .find(|p| p.exists())
                else {
                    bail!("{}: {name} not found in {dirs:?}", f.display());
                };
                if !out.contains(&p) {
                    out.push(p.clone());
                    todo.push(p);
                }
            }
        }
    }
    Ok(out)
}

fn add_elf(c: &mut cpio::Cpio, arch: Arch, at: &str, src: &Path) -> Result<()> {
    c.copy(at, src)?;
    for lib in libraries(arch, src)? {
        let at = lib.to_string_lossy().into_owned();
        c.copy(&at, &lib)?;
    }
    Ok(())
}

/// python3 and its standard library, without what the tests never import: the host's
/// own, or for another architecture Debian's packages of it, unpacked under the kernel
/// cache (`kernels::foreign_python`).
fn add_python(c: &mut cpio::Cpio, arch: Arch) -> Result<()> {
    let lib = if arch == Arch::host() {
        let Some(exe) = ["/usr/bin/python3.11", "/usr/bin/python3"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
        else {
            return Ok(());
        };
        let real = std::fs::canonicalize(exe)?;
        add_elf(c, arch, "/usr/bin/python3", &real)?;
        let name = real
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("python3")
            .to_owned();
        Path::new("/usr/lib").join(name)
    } else {
        let root = kernels::foreign_python(
            arch.deb_arch(),
            &cmd::target_dir().join("vm").join("kernels"),
        )?;
        let exe = root.join("usr/bin/python3.11");
        c.copy("/usr/bin/python3", &exe)?;
        for lib in foreign_libraries_in(arch, &exe, Some(&root))? {
            let at = Path::new("/").join(lib.strip_prefix(&root).unwrap_or(&lib));
            c.copy(&at.to_string_lossy(), &lib)?;
        }
        root.join("usr/lib/python3.11")
    };
    if !lib.is_dir() {
        return Ok(());
    }
    // Files go to their path in the guest (under /usr/lib).
    let guest_lib = Path::new("/usr/lib").join(lib.file_name().context("stdlib dir")?);
    const SKIP: &[&str] = &[
        "test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "dist-packages",
        "lib-dynload",
    ];
    let mut stack = vec![lib.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)? {
            let e = e?;
            let p = e.path();
            let n = e.file_name().to_string_lossy().into_owned();
            let ft = e.file_type()?;
            if ft.is_dir() {
                if dir == lib && (SKIP.contains(&n.as_str()) || n.starts_with("config-")) {
                    continue;
                }
                stack.push(p);
            } else if ft.is_file() {
                let at = guest_lib.join(p.strip_prefix(&lib).unwrap_or(&p));
                c.copy(&at.to_string_lossy(), &p)?;
            }
        }
    }
    Ok(())
}

/// The initramfs: busybox, `/init`, the profiler, the runner, the fixtures, python3 and
/// every library they need, at the host's paths.
fn build_initramfs(
    arch: Arch,
    out: &Path,
    runner: &Path,
    profiler: &Path,
    fx: &fixtures::Fixtures,
    guest_args: &[String],
) -> Result<()> {
    let mut c = cpio::Cpio::default();
    for d in [
        "/proc",
        "/sys",
        "/dev",
        "/tmp",
        "/run",
        "/bin",
        "/sbin",
        "/usr/bin",
        "/usr/sbin",
    ] {
        c.dir(d)?;
    }
    let busybox = if arch == Arch::host() {
        PathBuf::from("/bin/busybox")
    } else {
        kernels::foreign_busybox("arm64", &cmd::target_dir().join("vm").join("kernels"))?
    };
    c.copy("/bin/busybox", &busybox)?;
    add_elf(&mut c, arch, "/sframe/sframe-user", profiler)?;
    add_elf(&mut c, arch, "/sframe/xtask", runner)?;
    for f in fx.files() {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .context("fixture name")?;
        add_elf(&mut c, arch, &format!("/fixtures/{name}"), &f)?;
    }
    add_python(&mut c, arch)?;
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ip link set lo up
echo "{tag} init $(uname -r)"
/sframe/xtask vm-guest --profiler /sframe/sframe-user --fixtures /fixtures --lifecycle-min-complete 0.8 --lifecycle-min-chain 0.15 {args}
echo "{tag} end rc=$?"
poweroff -f
"#,
        tag = guest::TAG,
        args = guest_args.join(" "),
    );
    c.file("/init", 0o755, init.as_bytes())?;
    std::fs::write(out, c.finish()).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}
