//! Runs the `procfs_maps` fuzz target's body (fuzz/src/procfs_maps_body.rs) on stable:
//! this process's own maps, hostile variants of it (paths with invalid UTF-8, spaces,
//! ` (deleted)`, escapes, very long names), every truncation, and byte mutations.

#[path = "../../fuzz/src/procfs_maps_body.rs"]
mod body;

fn seeds() -> Vec<Vec<u8>> {
    let own = std::fs::read("/proc/self/maps").expect("own maps");
    let mut hostile = Vec::new();
    for path in [
        &b"/tmp/vict\xff"[..],
        b"/tmp/a b  c",
        b"/tmp/x (deleted)",
        b"/tmp/new\\012line",
        b"[vdso]",
        b"",
        b"\xc3\x28\xa0\xa1",
    ] {
        hostile.extend_from_slice(b"7f0000000000-7f0000001000 r-xp 00001000 fe:01 1835019   ");
        hostile.extend_from_slice(path);
        hostile.push(b'\n');
    }
    let mut long = b"1000-2000 r-xp 0 0:0 1 /".to_vec();
    long.extend(std::iter::repeat_n(b'a', 5000));
    vec![own, hostile, long]
}

#[test]
fn fuzz_body_on_mutated_maps() {
    for s in seeds() {
        body::run(&s);
        // Truncations and mutations of the first 2 KiB (every field kind is there).
        let head = &s[..s.len().min(2048)];
        for len in 0..head.len() {
            body::run(&head[..len]);
        }
        for pos in 0..head.len() {
            for x in [0x01u8, 0x20, 0x80, 0xff] {
                let mut m = head.to_vec();
                m[pos] ^= x;
                body::run(&m);
            }
        }
    }
}

#[test]
fn hostile_paths_parse_as_bytes() {
    let maps = sframe_user::procfs::parse_maps_bytes(&seeds()[1]).expect("parses");
    assert_eq!(maps.len(), 7);
    assert_eq!(maps[0].path_bytes(), b"/tmp/vict\xff");
    assert_eq!(maps[1].path, "/tmp/a b  c");
    assert_eq!(maps[2].live_path(), None);
}
