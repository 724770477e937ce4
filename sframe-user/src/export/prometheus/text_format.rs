//! The Prometheus text format (version 0.0.4) of our OpenMetrics exposition, for clients
//! that do not accept OpenMetrics: `promtool check metrics`, `curl -H 'Accept:
//! text/plain'`, older scrapers.
//!
//! Only what differs between the two is rewritten: a counter family `x` with samples
//! `x_total` becomes the family `x_total` (HELP and TYPE name the sample), `# UNIT` and
//! `# EOF` go, `unknown` is `untyped`, `x_created` samples, timestamps and exemplars are
//! dropped, and `\"` in HELP (an OpenMetrics escape) becomes `"`. Label sets and values
//! are written the same way in both formats.

/// Media type of the text format.
pub const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The text format of `openmetrics`, an exposition in the OpenMetrics text format.
pub fn from_openmetrics(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The family whose samples follow, and its type.
    let mut family: Option<(&str, &str)> = None;
    // HELP waits for TYPE, which decides the family's name.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take());
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let own_help = help.take_if(|(n, _)| *n == name);
            flush_help(&mut out, help.take());
            family = Some((name, kind));
            let (classic_name, classic_kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (name.to_owned(), kind),
                "unknown" => (name.to_owned(), "untyped"),
                // info, stateset, gaugehistogram: no equivalent; the samples stay, untyped.
                _ => continue,
            };
            if let Some((_, text)) = own_help {
                push_help(&mut out, &classic_name, text);
            }
            out.push_str("# TYPE ");
            out.push_str(&classic_name);
            out.push(' ');
            out.push_str(classic_kind);
            out.push('\n');
        } else if line.starts_with('#') {
            // # UNIT, # EOF and comments.
        } else if let Some((series, value)) = split_sample(line) {
            if let Some((name, "counter")) = family
                && series
                    .strip_prefix(name)
                    .is_some_and(|s| s.starts_with("_created"))
            {
                continue;
            }
            out.push_str(series);
            out.push(' ');
            out.push_str(value);
            out.push('\n');
        }
    }
    flush_help(&mut out, help);
    out
}

/// A HELP line whose TYPE never came.
fn flush_help(out: &mut String, help: Option<(&str, &str)>) {
    if let Some((name, text)) = help {
        push_help(out, name, text);
    }
}

fn push_help(out: &mut String, name: &str, text: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    out.push_str(&text.replace("\\\"", "\""));
    out.push('\n');
}

/// A sample line as (name and label set, value), without timestamp and exemplar. `None`
/// for a line that is not a sample.
fn split_sample(line: &str) -> Option<(&str, &str)> {
    let bytes = line.as_bytes();
    let mut end = bytes.iter().position(|&b| b == b'{' || b == b' ')?;
    if bytes.get(end) == Some(&b'{') {
        // Label values are quoted with `\` escapes; `}` and ` ` may appear inside.
        let mut quoted = false;
        let mut escaped = false;
        let close = bytes.get(end..)?.iter().position(|&b| {
            if escaped {
                escaped = false;
            } else if quoted {
                match b {
                    b'\\' => escaped = true,
                    b'"' => quoted = false,
                    _ => {}
                }
            } else if b == b'"' {
                quoted = true;
            } else if b == b'}' {
                return true;
            }
            false
        })?;
        end += close + 1;
    }
    let value = line[end..].split_whitespace().next()?;
    Some((&line[..end], value))
}

/// The length in bytes of the longest label value of one exposition line, unescaped (the
/// length a backend such as Mimir checks against its limit); 0 without labels.
pub fn longest_label_value(line: &str) -> usize {
    let Some((_, labels)) = line.split_once('{') else {
        return 0;
    };
    let (mut longest, mut len, mut inside) = (0, 0, false);
    let mut chars = labels.chars();
    while let Some(c) = chars.next() {
        match (inside, c) {
            (false, '"') => (inside, len) = (true, 0),
            (false, '}') => break,
            (true, '\\') => {
                let _ = chars.next();
                len += 1;
            }
            (true, '"') => {
                inside = false;
                longest = longest.max(len);
            }
            (true, c) => len += c.len_utf8(),
            _ => {}
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_measured_unescaped() {
        assert_eq!(longest_label_value(r#"m{comm="a\"b",stack="xyz;w"} 3"#), 5);
        assert_eq!(longest_label_value(r#"m{a="\\\\"} 1"#), 2);
        assert_eq!(longest_label_value("m 3"), 0);
    }

    #[test]
    fn counters_are_renamed_and_openmetrics_only_lines_dropped() {
        let om = "# HELP requests Requests \\\"served\\\".\n\
            # TYPE requests counter\n\
            requests_total{path=\"a}b # {c\"} 3 1700000000.5 # {trace=\"x\"} 1.0\n\
            requests_created{path=\"a}b # {c\"} 1700000000.0\n\
            # HELP size_bytes Size.\n\
            # TYPE size_bytes gauge\n\
            # UNIT size_bytes bytes\n\
            size_bytes 42\n\
            # HELP lat Latency.\n\
            # TYPE lat histogram\n\
            lat_bucket{le=\"1.0\"} 1\n\
            lat_bucket{le=\"+Inf\"} 2\n\
            lat_sum 3.5\n\
            lat_count 2\n\
            # HELP odd Something.\n\
            # TYPE odd unknown\n\
            odd NaN\n\
            # EOF\n";
        let expected = "# HELP requests_total Requests \"served\".\n\
            # TYPE requests_total counter\n\
            requests_total{path=\"a}b # {c\"} 3\n\
            # HELP size_bytes Size.\n\
            # TYPE size_bytes gauge\n\
            size_bytes 42\n\
            # HELP lat Latency.\n\
            # TYPE lat histogram\n\
            lat_bucket{le=\"1.0\"} 1\n\
            lat_bucket{le=\"+Inf\"} 2\n\
            lat_sum 3.5\n\
            lat_count 2\n\
            # HELP odd Something.\n\
            # TYPE odd untyped\n\
            odd NaN\n";
        assert_eq!(from_openmetrics(om), expected);
    }

    #[test]
    fn escaped_quotes_in_label_values_do_not_end_the_label_set() {
        let om = "# TYPE s counter\ns_total{stack=\"a\\\"}\\\\\",pid=\"1\"} 5\n";
        assert_eq!(
            from_openmetrics(om),
            "# TYPE s_total counter\ns_total{stack=\"a\\\"}\\\\\",pid=\"1\"} 5\n"
        );
    }

    #[test]
    fn malformed_lines_are_dropped_not_panicked_on() {
        for om in [
            "x{a=\"1\" 2\n",
            "{\n",
            "x\n",
            "# HELP\n# TYPE\n",
            "\u{1F980}{\"} 1\n",
        ] {
            let _ = from_openmetrics(om);
        }
        assert_eq!(from_openmetrics("x{a=\"1\" 2\n"), "");
    }
}
