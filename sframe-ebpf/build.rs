//! Rebuild the BPF object when `bpf-linker` changes: cargo cannot see that dependency.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo:warning=bpf-linker not found on PATH ({err}); run `cargo xtask setup`")
        }
    }
}
