//! Runs the `sframe_read` fuzz target's body (fuzz/src/sframe_read_body.rs) on stable:
//! every vector, every truncation, and byte mutations of each, plus random inputs.

#[path = "../../fuzz/src/sframe_read_body.rs"]
mod body;
mod sframe_support;

fn seed(base: u64, content: &[u8]) -> Vec<u8> {
    let mut s = base.to_le_bytes().to_vec();
    s.extend_from_slice(content);
    s
}

#[test]
fn fuzz_body_on_mutated_vectors() {
    let Some(vectors) = sframe_support::load_vectors() else {
        return;
    };
    for v in &vectors {
        let s = seed(v.section_base, &v.content);
        body::run(&s);
        for len in 0..s.len() {
            body::run(&s[..len]);
        }
        for pos in 8..s.len() {
            for x in [0x01u8, 0x02, 0x04, 0x10, 0x20, 0x40, 0x80, 0xff] {
                let mut m = s.clone();
                m[pos] ^= x;
                body::run(&m);
            }
        }
    }
}

#[test]
fn fuzz_body_on_random_inputs() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for n in 0..20_000usize {
        let len = n % 200;
        let mut buf = Vec::with_capacity(len + 8);
        for _ in 0..len + 8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.push(x as u8);
        }
        // Make many inputs start with a plausible preamble.
        if n % 2 == 0 && buf.len() >= 14 {
            buf[8..14].copy_from_slice(&[0xe2, 0xde, (n % 4) as u8, (n / 4 % 8) as u8, 3, 0]);
        }
        body::run(&buf);
    }
}

/// The hand-built samples (s390x, big-endian AArch64, FLEX-heavy v3, signal frames,
/// fixed FP offset; see `sframe_support::build`), every truncation and byte mutation of
/// each: the shapes the writer-made and gcc-made inputs lack (the fuzz corpus gets the
/// same shapes from `fuzz/make-corpus.sh`).
#[test]
fn fuzz_body_on_mutated_hand_built_sections() {
    for (name, spec) in sframe_support::build::samples() {
        let b = sframe_support::build::build(&spec);
        let s = seed(spec.vaddr, &b.bytes);
        body::run(&s);
        for len in 0..s.len() {
            body::run(&s[..len]);
        }
        for pos in 8..s.len() {
            for x in [0x01u8, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff] {
                let mut m = s.clone();
                m[pos] ^= x;
                body::run(&m);
            }
            for d in [1u8, 0xff] {
                let mut m = s.clone();
                m[pos] = m[pos].wrapping_add(d);
                body::run(&m);
            }
        }
        eprintln!("{name}: {} bytes mutated", s.len());
    }
}
