//! Builds the eBPF crate for the BPF target (nightly, build-std=core, bpf-linker) and puts
//! the object in OUT_DIR, where `include_bytes_aligned!` embeds it.
//! Without the `profiler` feature there is nothing to build.
//!
//! aya-build keeps its cargo target directory inside OUT_DIR, and every profile and
//! feature set of this crate (build, test, clippy, release, the benchmark) has an OUT_DIR
//! of its own: each would build `core` and the eBPF crate from scratch (half a minute on
//! two cores, four or five times per `cargo xtask test`). So aya-build is pointed at one
//! directory per target directory and BPF architecture, and the object is copied from
//! there (cargo's lock on that directory orders concurrent builds).

#[cfg(not(feature = "profiler"))]
fn main() {}

#[cfg(feature = "profiler")]
fn main() -> anyhow::Result<()> {
    use anyhow::Context as _;
    use aya_build::{Package, Toolchain};
    use std::path::PathBuf;

    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    // OUT_DIR is TARGET/[TRIPLE/]PROFILE/build/sframe-user-HASH/out.
    let shared = out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(|build| build.parent()?.parent())
        .map(|target| target.join("bpf-build").join(&arch));
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../sframe-ebpf");
    let package = Package {
        name: "sframe-ebpf",
        root_dir: root,
        ..Default::default()
    };
    let Some(shared) = shared else {
        return aya_build::build_ebpf([package], Toolchain::Nightly);
    };
    std::fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    // SAFETY: the build script is single-threaded here; aya-build reads OUT_DIR only.
    unsafe { std::env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf([package], Toolchain::Nightly);
    // SAFETY: as above.
    unsafe { std::env::set_var("OUT_DIR", &out_dir) };
    built?;
    // aya-build left the eBPF crate's binaries (named after their targets) beside its
    // `aya-build` directory; none when AYA_BUILD_SKIP asked it to build nothing.
    for entry in std::fs::read_dir(&shared)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            let from = entry.path();
            std::fs::copy(&from, out_dir.join(entry.file_name())).with_context(|| {
                format!("copying {} into {}", from.display(), out_dir.display())
            })?;
        }
    }
    Ok(())
}
