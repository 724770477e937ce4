//! One rule for every name that reaches an output — command names, symbol names,
//! object names — in folded stacks, SVG, pprof and Prometheus alike: they come from
//! processes and files the profiler does not trust, so none may carry a line break or a
//! control character into a format that is split on them, or grow without bound.

use std::borrow::Cow;

/// Longest name kept, in characters; a longer one is cut and ends in `…`.
pub const MAX_NAME_CHARS: usize = 1024;

/// `raw` with every control character (C0, DEL, C1; newlines and tabs included) written
/// as a visible escape (`\n`, `\t`, `\r`, `\x1b`, `\u{85}`), cut to [`MAX_NAME_CHARS`].
/// Borrowed when nothing needed changing (the common case).
pub fn name(raw: &str) -> Cow<'_, str> {
    let clean = raw.chars().all(|c| !c.is_control()) && raw.len() <= MAX_NAME_CHARS;
    if clean {
        return Cow::Borrowed(raw);
    }
    let mut out = String::with_capacity(raw.len().min(MAX_NAME_CHARS) + 8);
    for (i, c) in raw.chars().enumerate() {
        if i >= MAX_NAME_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`name`] of bytes that may not be UTF-8 (a command name, a path): invalid sequences
/// become U+FFFD, never an error and never a dropped name.
pub fn name_bytes(raw: &[u8]) -> String {
    name(&String::from_utf8_lossy(raw)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_names_are_borrowed() {
        assert!(matches!(name("main"), Cow::Borrowed("main")));
        assert!(matches!(
            name("std::vector<int>::push_back(int&&)"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn control_characters_become_visible_escapes() {
        assert_eq!(name("v 99999\nq\"{}\\"), "v 99999\\nq\"{}\\");
        assert_eq!(name("a\rb\tc\x1bd\x7fe"), "a\\rb\\tc\\x1bd\\x7fe");
        assert_eq!(name("x\u{85}y"), "x\\u{85}y");
        assert!(!name("\n\n\n").contains('\n'));
    }

    #[test]
    fn long_names_are_cut() {
        let long = "a".repeat(5000);
        let n = name(&long);
        assert_eq!(n.chars().count(), MAX_NAME_CHARS + 1);
        assert!(n.ends_with('…'));
    }

    #[test]
    fn invalid_utf8_is_replaced_not_dropped() {
        assert_eq!(name_bytes(b"vict\xff"), "vict\u{fffd}");
        assert_eq!(name_bytes(b"ok"), "ok");
    }
}
