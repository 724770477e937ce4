//! Interactive flame graphs (SVG) with inferno.

use std::io::Write;

use inferno::flamegraph::{self, Options};

use super::{ExportError, Profile, folded::folded_lines};

/// Writes the flame graph of `profile`: one tower per process (its comm at the base),
/// titled with the targets and the duration.
pub fn svg(profile: &Profile, out: &mut dyn Write) -> Result<(), ExportError> {
    let lines: Vec<String> = folded_lines(profile)
        .into_iter()
        .map(|(stack, count)| format!("{stack} {count}"))
        .collect();
    let mut options = Options::default();
    options.title = profile.title();
    if profile.off_cpu {
        options.title = format!("Off-CPU time: {}", profile.title());
        options.subtitle = Some(format!(
            "{:.3} s asleep, sleeps of at least the threshold (sframe-user)",
            profile.total_samples() as f64 / 1e9
        ));
        options.count_name = "us".to_owned();
    } else {
        options.subtitle = Some(format!(
            "{} samples at {} Hz (sframe-user)",
            profile.total_samples(),
            profile.frequency
        ));
        options.count_name = "samples".to_owned();
    }
    // inferno refuses an empty profile: draw one placeholder frame under the title (the
    // subtitle says 0 samples).
    let placeholder = ["[no samples] 1".to_owned()];
    let lines = if lines.is_empty() {
        &placeholder[..]
    } else {
        &lines[..]
    };
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
        .map_err(|source| ExportError::FlameGraph { source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::tests::sample_profile;

    fn render(p: &Profile) -> String {
        let mut buf = Vec::new();
        svg(p, &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    /// inferno draws `name_[k]` as `name` (the suffix picks the kernel color in the
    /// perl/java palettes).
    #[test]
    fn svg_has_title_and_frames() {
        let text = render(&sample_profile());
        assert!(
            text.starts_with("<?xml"),
            "{}",
            &text[..100.min(text.len())]
        );
        assert!(text.trim_end().ends_with("</svg>"));
        assert!(text.contains("my prog (pid 42), other (pid 43), 2.5 s"));
        for name in [
            "_start",
            "main",
            "helper",
            "leaf:fn",
            "[libc.so.6+0x2a3f0]",
            "do_syscall_64",
            "my_prog",
        ] {
            assert!(text.contains(&format!("<title>{name} (")), "{name} missing");
        }
    }

    #[test]
    fn empty_profile_still_renders() {
        let text = render(&Profile::default());
        assert!(text.contains("no process, 0.0 s"), "{text}");
    }
}
