//! Builds the eBPF crate for the BPF target (nightly, build-std=core, bpf-linker) and puts
//! the object in OUT_DIR, where `include_bytes_aligned!` embeds it.
//! Without the `profiler` feature there is nothing to build.

#[cfg(not(feature = "profiler"))]
fn main() {}

#[cfg(feature = "profiler")]
fn main() -> anyhow::Result<()> {
    use aya_build::{Package, Toolchain};
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../sframe-ebpf");
    aya_build::build_ebpf(
        [Package {
            name: "sframe-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::Nightly,
    )
}
