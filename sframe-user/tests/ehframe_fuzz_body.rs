//! Runs the `ehframe_derive` fuzz target's body (fuzz/src/ehframe_derive_body.rs) on
//! stable: small system objects, their truncations and byte mutations of their headers
//! and CFI sections.

use object::{Object, ObjectSection};

#[path = "../../fuzz/src/ehframe_derive_body.rs"]
mod body;

#[test]
fn fuzz_body_on_mutated_objects() {
    let candidates = [
        "/lib/x86_64-linux-gnu/libgcc_s.so.1",
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "/bin/true",
    ];
    let mut ran = 0;
    for path in candidates {
        let Ok(data) = std::fs::read(path) else {
            continue;
        };
        ran += 1;
        body::run(&data);
        for len in (0..data.len()).step_by(data.len() / 97 + 1) {
            body::run(&data[..len]);
        }
        // Mutate the ELF header and the CFI sections, where the parsers look.
        let mut spots: Vec<usize> = (0..64).collect();
        if let Ok(f) = object::File::parse(&*data) {
            for name in [".eh_frame_hdr", ".eh_frame", ".plt", ".sframe"] {
                if let Some((off, len)) = f.section_by_name(name).and_then(|s| s.file_range()) {
                    let step = (len as usize / 61).max(1);
                    spots.extend((off as usize..(off + len) as usize).step_by(step).take(64));
                }
            }
        }
        for &pos in &spots {
            for x in [0x01u8, 0x80, 0xff] {
                let mut m = data.clone();
                if let Some(b) = m.get_mut(pos) {
                    *b ^= x;
                }
                body::run(&m);
            }
        }
    }
    if ran == 0 {
        eprintln!("skipping: no system objects found");
    }
}
