//! The kernels of the VM matrix: Debian's own kernel packages, found with `apt-cache`,
//! fetched with `apt-get download` and cached under `target/vm/kernels/` (never
//! committed). Only the kernel image is kept: Debian's kernels have everything the
//! tests need built in (BPF, BTF, perf events, the serial console, initramfs).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// One entry of the matrix.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// Short name (`6.1`, `6.12`, `host`).
    pub name: String,
    /// Where it runs: a Debian package booted under qemu, or this machine's kernel.
    pub source: KernelSource,
}

#[derive(Clone, Debug)]
pub enum KernelSource {
    /// The newest package whose name matches `prefix` + version digits + `suffix`, in
    /// the host's apt lists or in a suite of the project's own (`apt`).
    Debian {
        prefix: &'static str,
        suffix: &'static str,
        apt: Option<&'static Suite>,
    },
    /// The running kernel: the guest tests run directly on this machine.
    Host,
}

/// The x86-64 matrix: Debian 12's kernel (6.1, the oldest LTS fleets run), Debian 13's
/// (6.12, shipped to Debian 12 as well), and this machine's own, the newest.
pub fn x86_64_matrix() -> Vec<Kernel> {
    vec![
        Kernel {
            name: "6.1".into(),
            source: KernelSource::Debian {
                prefix: "linux-image-6.1.0-",
                suffix: "-cloud-amd64",
                apt: None,
            },
        },
        Kernel {
            name: "6.12".into(),
            source: KernelSource::Debian {
                prefix: "linux-image-6.12.",
                suffix: "-cloud-amd64",
                apt: None,
            },
        },
        Kernel {
            name: "host".into(),
            source: KernelSource::Host,
        },
    ]
}

/// The arm64 matrix: the same series, Debian's arm64 cloud flavour (built-in PL011
/// console, BPF, BTF, pointer authentication).
pub fn aarch64_matrix() -> Vec<Kernel> {
    vec![
        Kernel {
            name: "6.1".into(),
            source: KernelSource::Debian {
                prefix: "linux-image-6.1.0-",
                suffix: "-cloud-arm64",
                apt: None,
            },
        },
        Kernel {
            name: "6.12".into(),
            source: KernelSource::Debian {
                prefix: "linux-image-6.12.",
                suffix: "-cloud-arm64",
                apt: None,
            },
        },
    ]
}

/// Kernels run only when named (`--kernel 5.10`), not in the default matrix: Debian
/// 11's 5.10, which the profiler does not start on yet (off-CPU needs task storage,
/// Linux 5.11, and the BTF `sched_switch` of 5.18: see README, "Kernels").
pub fn on_request(arch_suffix: &'static str) -> Vec<Kernel> {
    vec![Kernel {
        name: "5.10".into(),
        source: KernelSource::Debian {
            prefix: "linux-image-5.10.0-",
            suffix: if arch_suffix == "arm64" {
                "-cloud-arm64"
            } else {
                "-cloud-amd64"
            },
            apt: Some(&BULLSEYE),
        },
    }]
}

/// Debian suites the host's apt does not list, read through an apt configuration of
/// the project's own under `target/vm/apt/NAME` (its sources, lists and caches; the
/// host's sources and lists are never touched).
#[derive(Debug)]
pub struct Suite {
    pub name: &'static str,
    /// The `sources.list` lines.
    pub sources: &'static str,
}

/// Debian 11's kernels (5.10): its main suite and its security updates.
pub static BULLSEYE: Suite = Suite {
    name: "bullseye",
    sources: "deb http://deb.debian.org/debian bullseye main\n\
              deb http://security.debian.org/debian-security bullseye-security main\n",
};

/// The apt options that make apt read `suite` only (none: the host's configuration).
fn apt_options(suite: Option<&Suite>) -> Result<Vec<String>> {
    let Some(suite) = suite else {
        return Ok(Vec::new());
    };
    let dir = cmd::target_dir().join("vm").join("apt").join(suite.name);
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {}", dir.join(sub).display()))?;
    }
    let sources = dir.join("sources.list");
    std::fs::write(&sources, suite.sources)
        .with_context(|| format!("writing {}", sources.display()))?;
    let d = dir.display();
    Ok([
        format!("Dir::Etc::sourcelist={}", sources.display()),
        "Dir::Etc::sourceparts=-".to_owned(),
        format!("Dir::State::Lists={d}/lists"),
        format!("Dir::Cache={d}/cache"),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_owned(), o])
    .collect())
}

/// Natural order of package names: digit runs compare as numbers.
fn natural_key(s: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut digits = String::new();
    let mut text = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !text.is_empty() {
                out.push((0, std::mem::take(&mut text)));
            }
            digits.push(c);
        } else {
            if !digits.is_empty() {
                out.push((digits.parse().unwrap_or(u64::MAX), String::new()));
                digits.clear();
            }
            text.push(c);
        }
    }
    if !digits.is_empty() {
        out.push((digits.parse().unwrap_or(u64::MAX), String::new()));
    }
    if !text.is_empty() {
        out.push((0, text));
    }
    out
}

/// Whether `name` is `prefix` + a version (digits, dots, `+debNN`) + `suffix`, the form
/// of the signed image packages (not `-unsigned`, `-dbg`, `-rt-`).
fn matches(name: &str, prefix: &str, suffix: &str) -> bool {
    let Some(mid) = name
        .strip_prefix(prefix)
        .and_then(|r| r.strip_suffix(suffix))
    else {
        return false;
    };
    !mid.is_empty()
        && mid.starts_with(|c: char| c.is_ascii_digit())
        && mid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '+')
}

fn apt_candidates(prefix: &str, suffix: &str, apt: &[String]) -> Vec<String> {
    let pattern = format!("^{}", prefix.replace('.', "\\."));
    let out =
        cmd::output(
            Command::new("apt-cache")
                .args(apt)
                .args(["search", "--names-only", &pattern]),
        )
        .unwrap_or_default();
    let mut names: Vec<String> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| matches(n, prefix, suffix))
        .map(str::to_owned)
        .collect();
    names.sort_by_key(|n| natural_key(n));
    names
}

/// The newest package of the series (in `suite`, or the host's lists); runs `apt-get
/// update` once when the lists know none.
pub fn resolve(prefix: &str, suffix: &str, suite: Option<&Suite>) -> Result<String> {
    let apt = apt_options(suite)?;
    if let Some(name) = apt_candidates(prefix, suffix, &apt).pop() {
        return Ok(name);
    }
    let mut update = cmd::privileged("apt-get");
    update
        .args(&apt)
        .args(["update", "-q", "-o", "DPkg::Lock::Timeout=600"]);
    cmd::run(&mut update, "apt-get update (no kernel package known yet)")?;
    apt_candidates(prefix, suffix, &apt)
        .pop()
        .with_context(|| format!("no Debian package named {prefix}*{suffix} in the apt lists"))
}

/// The kernel image of package `name` (of `suite`, or the host's lists), downloaded
/// and extracted into `cache` once.
pub fn fetch(name: &str, suite: Option<&Suite>, cache: &Path) -> Result<PathBuf> {
    // A foreign architecture's package is named `NAME:ARCH` to apt.
    let arch_suffix = if name.ends_with("-arm64") {
        ":arm64"
    } else {
        ""
    };
    let dir = cache.join(name);
    let image = dir.join("vmlinuz");
    if image.is_file() {
        return Ok(image);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut download = Command::new("apt-get");
    download.current_dir(&dir).args(apt_options(suite)?).args([
        "download",
        "-q",
        &format!("{name}{arch_suffix}"),
    ]);
    cmd::run(&mut download, &format!("download kernel package {name}"))?;
    let deb = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download {name} left no .deb in {}", dir.display()))?;
    let unpacked = dir.join("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::create_dir_all(&unpacked)?;
    let mut extract = Command::new("sh");
    extract.arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*'",
        deb.display(),
        unpacked.display()
    ));
    // (arm64's vmlinuz is an uncompressed Image, which qemu's -kernel boots as it is.)
    cmd::run(&mut extract, &format!("extract the kernel image of {name}"))?;
    let boot = unpacked.join("boot");
    let found = std::fs::read_dir(&boot)
        .with_context(|| format!("{name}: no boot/ in the package"))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        });
    let Some(found) = found else {
        bail!("{name}: the package has no boot/vmlinuz-*");
    };
    std::fs::rename(&found, &image)?;
    let _ = std::fs::remove_dir_all(&unpacked);
    let _ = std::fs::remove_file(&deb);
    Ok(image)
}

/// The static busybox of another architecture, from Debian's `busybox-static:ARCH`
/// package, downloaded and unpacked into `cache` once (installing it would replace the
/// host's own busybox: the package is not co-installable).
pub fn foreign_busybox(deb_arch: &str, cache: &Path) -> Result<PathBuf> {
    let dir = cache.join(format!("busybox-{deb_arch}"));
    let bin = dir.join("busybox");
    if bin.is_file() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    let mut download = Command::new("apt-get");
    download
        .current_dir(&dir)
        .args(["download", "-q", &format!("busybox-static:{deb_arch}")]);
    cmd::run(
        &mut download,
        &format!("download busybox-static:{deb_arch}"),
    )?;
    let deb = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("no busybox .deb downloaded")?;
    let mut extract = Command::new("sh");
    extract.arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -O ./bin/busybox > '{}' && chmod 755 '{}'",
        deb.display(),
        bin.display(),
        bin.display()
    ));
    cmd::run(&mut extract, "extract busybox")?;
    let _ = std::fs::remove_file(&deb);
    Ok(bin)
}

/// Debian's python3.11 for `deb_arch` and what it links, unpacked under `cache`
/// (`python-ARCH/usr/bin/python3.11`, its standard library, zlib and expat): the
/// guests of that architecture run it. Returns the root it is unpacked in.
pub fn foreign_python(deb_arch: &str, cache: &Path) -> Result<PathBuf> {
    let dir = cache.join(format!("python-{deb_arch}"));
    if dir.join("usr/bin/python3.11").is_file() {
        return Ok(dir);
    }
    let debs = cache.join(format!("python-{deb_arch}-debs"));
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::create_dir_all(&debs)?;
    let packages = [
        "python3.11-minimal",
        "libpython3.11-minimal",
        "zlib1g",
        "libexpat1",
    ];
    let mut download = Command::new("apt-get");
    download.current_dir(&debs).args(["download", "-q"]);
    for p in packages {
        download.arg(format!("{p}:{deb_arch}"));
    }
    cmd::run(
        &mut download,
        &format!("download python3.11 for {deb_arch}"),
    )?;
    // Unpacked beside, then renamed: a half-unpacked root is never taken for a whole one.
    let partial = cache.join(format!("python-{deb_arch}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial)?;
    for deb in std::fs::read_dir(&debs)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
    {
        let mut extract = Command::new("dpkg-deb");
        extract.arg("-x").arg(&deb).arg(&partial);
        cmd::run(&mut extract, &format!("unpack {}", deb.display()))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    let _ = std::fs::remove_dir_all(&debs);
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_sort_by_version_and_filter_flavours() {
        let mut v = [
            "linux-image-6.1.0-9-cloud-amd64",
            "linux-image-6.1.0-57-cloud-amd64",
            "linux-image-6.1.0-48-cloud-amd64",
        ];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v.last(), Some(&"linux-image-6.1.0-57-cloud-amd64"));
        let (p, s) = ("linux-image-6.12.", "-cloud-amd64");
        assert!(matches("linux-image-6.12.117+deb12-cloud-amd64", p, s));
        assert!(!matches(
            "linux-image-6.12.117+deb12-cloud-amd64-unsigned",
            p,
            s
        ));
        assert!(!matches("linux-image-6.12.117+deb12-rt-amd64", p, s));
        assert!(!matches(
            "linux-image-6.1.0-57-cloud-amd64-dbg",
            "linux-image-6.1.0-",
            s
        ));
    }
}
