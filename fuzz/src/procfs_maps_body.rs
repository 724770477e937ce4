//! Body of the `procfs_maps` fuzz target, shared with a plain test in `sframe-user`
//! (`tests/procfs_maps_fuzz_body.rs`) so it is compiled and exercised on stable too.
//!
//! Input: the bytes of a `/proc/PID/maps` file, which a hostile process shapes through
//! the paths it maps (any byte but NUL, not necessarily UTF-8).
//! Properties: nothing panics; a parse that succeeds gives one mapping per non-blank
//! line, each with `start <= end`, whose path bytes are exactly the line's tail after
//! the five fields (never dropped, never altered), and whose display path is their lossy
//! UTF-8 form.

use sframe_user::procfs::parse_maps_bytes;

pub fn run(data: &[u8]) {
    let Ok(maps) = parse_maps_bytes(data) else {
        return;
    };
    let lines: Vec<&[u8]> = data
        .split(|&b| b == b'\n')
        .filter(|l| !l.trim_ascii().is_empty())
        .collect();
    assert_eq!(maps.len(), lines.len(), "one mapping per line");
    for (m, line) in maps.iter().zip(lines) {
        assert!(m.start <= m.end, "{m:?}");
        // The path is what follows the fifth field and its separating spaces.
        let mut rest = line;
        for _ in 0..5 {
            let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
            rest = &rest[start..];
            let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
            rest = &rest[end..];
        }
        let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
        assert_eq!(m.path_bytes(), &rest[start..], "path bytes kept");
        assert_eq!(
            m.path,
            String::from_utf8_lossy(m.path_bytes()),
            "display path"
        );
        assert_eq!(
            m.raw_path.is_some(),
            std::str::from_utf8(m.path_bytes()).is_err()
        );
        if let Some(p) = m.live_path() {
            assert!(p.starts_with(b"/") && !p.ends_with(b" (deleted)"));
        }
    }
}
