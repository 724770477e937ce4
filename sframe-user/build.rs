//! Builds the eBPF crate for the BPF target (nightly, build-std=core, bpf-linker) and puts
//! the object in OUT_DIR, where `include_bytes_aligned!` embeds it.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    if std::env::var_os("CARGO_FEATURE_BPF").is_none() {
        return Ok(());
    }
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
