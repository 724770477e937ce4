//! The outputs end to end: the `sframe-user` binary profiles a compiled C fixture and
//! writes svg and pprof files. Google's `pprof` tool (built from Debian's sources) reads
//! the pprof files. (The Prometheus exporter: `tests/prometheus.rs`.)

mod support;

use std::{
    io::Read as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use prost::Message as _;
use sframe_user::export::pprof::proto;
use support::{bpf_or_skip, spawn_chain};

const BIN: &str = env!("CARGO_BIN_EXE_sframe-user");

fn run_profiler(args: &[&str]) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sframe-user");
    assert!(
        out.status.success(),
        "sframe-user {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A frame box of an inferno flame graph.
#[derive(Debug)]
struct SvgFrame {
    name: String,
    /// Horizontal extent in samples (`fg:x`, `fg:w`).
    x: u64,
    w: u64,
    /// Top of the box; callers are drawn below their callees.
    y: f64,
}

/// Parses `svg` as XML (panicking unless it is well-formed) and returns its frame boxes:
/// each `<g>` with a `<title>NAME (N samples, P%)</title>` and a `<rect>`.
fn svg_frames(svg: &str) -> Vec<SvgFrame> {
    const FG: &str = "http://github.com/jonhoo/inferno";
    let doc = roxmltree::Document::parse_with_options(
        svg,
        roxmltree::ParsingOptions {
            // inferno writes the SVG 1.1 DOCTYPE (an external DTD, which is not read).
            allow_dtd: true,
            ..roxmltree::ParsingOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("the SVG is not well-formed XML: {e}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    doc.descendants()
        .filter(|n| n.has_tag_name("g"))
        .filter_map(|g| {
            let title = g.children().find(|c| c.has_tag_name("title"))?.text()?;
            let rect = g.children().find(|c| c.has_tag_name("rect"))?;
            let (name, _) = title.rsplit_once(" (")?;
            let num = |attr: &str, value: Option<&str>| {
                value
                    .unwrap_or_else(|| panic!("{title}: no {attr}"))
                    .parse::<f64>()
                    .unwrap_or_else(|e| panic!("{title}: {attr}: {e}"))
            };
            Some(SvgFrame {
                name: name.to_owned(),
                x: num("fg:x", rect.attribute((FG, "x"))) as u64,
                w: num("fg:w", rect.attribute((FG, "w"))) as u64,
                y: num("y", rect.attribute("y")),
            })
        })
        .collect()
}

/// The flame graph in `svg` has a column whose frames, from the bottom, include `path`
/// in that order, consecutive from `path[1]` on (`path[0]` is the process name, under
/// the start-up frames).
fn svg_has_path(svg: &str, path: &[&str]) {
    let frames = svg_frames(svg);
    let leaf = path.last().unwrap();
    let mut columns = Vec::new();
    for top in frames.iter().filter(|f| f.name == *leaf && f.w > 0) {
        // Every box under `top` that spans it, bottom first: one per row, each containing
        // the next.
        let mut column: Vec<&SvgFrame> = frames
            .iter()
            .filter(|f| f.y > top.y && f.x <= top.x && top.x + top.w <= f.x + f.w)
            .collect();
        column.sort_by(|a, b| b.y.total_cmp(&a.y));
        column.push(top);
        for pair in column.windows(2) {
            assert!(
                pair[1].x >= pair[0].x && pair[1].x + pair[1].w <= pair[0].x + pair[0].w,
                "{pair:?}"
            );
            assert!(pair[1].y < pair[0].y, "two boxes in one row: {pair:?}");
        }
        let names: Vec<&str> = column.iter().map(|f| f.name.as_str()).collect();
        // Under the process name: "all".
        let comm = names.iter().position(|n| *n == path[0]);
        let tail = names.windows(path.len() - 1).position(|w| w == &path[1..]);
        if let (Some(comm), Some(tail)) = (comm, tail)
            && comm < tail
            && tail + path.len() - 1 == names.len()
        {
            return;
        }
        columns.push(names);
    }
    panic!("no column {path:?} in the flame graph; columns ending in {leaf}: {columns:?}");
}

#[test]
fn svg_path_check_rejects_wrong_orders() {
    let frame = |name: &str, x: u64, w: u64, row: u32| {
        format!(
            "<g><title>{name} ({w} samples, 1%)</title><rect x=\"0%\" y=\"{}\" width=\"1%\" height=\"15\" fg:x=\"{x}\" fg:w=\"{w}\"/></g>",
            200 - 16 * row
        )
    };
    let svg = |boxes: &[String]| {
        format!(
            "<?xml version=\"1.0\"?><svg xmlns=\"http://www.w3.org/2000/svg\" xmlns:fg=\"http://github.com/jonhoo/inferno\"><g id=\"frames\">{}</g></svg>",
            boxes.concat()
        )
    };
    let good = svg(&[
        frame("all", 0, 10, 0),
        frame("p", 0, 10, 1),
        frame("main", 0, 10, 2),
        frame("a", 0, 6, 3),
        frame("b", 6, 4, 3),
        frame("leaf", 1, 5, 4),
    ]);
    svg_has_path(&good, &["p", "main", "a", "leaf"]);
    for (boxes, path) in [
        // leaf is over b, not a.
        (
            vec![
                frame("p", 0, 10, 1),
                frame("main", 0, 10, 2),
                frame("a", 0, 6, 3),
                frame("b", 6, 4, 3),
                frame("leaf", 7, 2, 4),
            ],
            &["p", "main", "a", "leaf"][..],
        ),
        // Order reversed.
        (
            vec![
                frame("p", 0, 10, 1),
                frame("a", 0, 10, 2),
                frame("main", 0, 10, 3),
                frame("leaf", 0, 10, 4),
            ],
            &["p", "main", "a", "leaf"][..],
        ),
        // A frame in between.
        (
            vec![
                frame("p", 0, 10, 1),
                frame("main", 0, 10, 2),
                frame("x", 0, 10, 3),
                frame("a", 0, 10, 4),
                frame("leaf", 0, 10, 5),
            ],
            &["p", "main", "a", "leaf"][..],
        ),
    ] {
        let svg = svg(&boxes);
        let result = std::panic::catch_unwind(|| svg_has_path(&svg, path));
        assert!(result.is_err(), "accepted: {svg}");
    }
    let broken = good.replace("</svg>", "");
    assert!(std::panic::catch_unwind(|| svg_frames(&broken)).is_err());
}

fn decode_pprof(path: &Path) -> proto::Profile {
    let bytes = std::fs::read(path).expect("read the pprof file");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .read_to_end(&mut raw)
        .expect("gzip");
    proto::Profile::decode(raw.as_slice()).expect("profile.proto")
}

#[test]
fn svg_and_pprof_of_fixture() {
    if !bpf_or_skip("svg_and_pprof_of_fixture") {
        return;
    }
    let chain = spawn_chain();
    let pid = chain.pid().to_string();
    let dir = support::fixture_dir("export-out");
    let svg = dir.join("flame.svg");
    let pb = dir.join("profile.pb.gz");
    let common = ["--pid", &pid, "--duration", "2", "--frequency", "499"];
    run_profiler(
        &[
            &common[..],
            &["--format", "svg", "--output", svg.to_str().unwrap()],
        ]
        .concat(),
    );
    run_profiler(
        &[
            &common[..],
            &["--format", "pprof", "--output", pb.to_str().unwrap()],
        ]
        .concat(),
    );
    drop(chain);

    let text = std::fs::read_to_string(&svg).expect("read svg");
    assert!(text.contains(&format!("chain (pid {pid}), ")), "title");
    svg_has_path(&text, &["chain", "main", "f0", "f1", "f2", "leaf"]);

    let p = decode_pprof(&pb);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(p.period, 1_000_000_000 / 499);
    let chain_map = p
        .mapping
        .iter()
        .find(|m| s(m.filename) == "chain")
        .expect("mapping of the fixture");
    assert!(!s(chain_map.build_id).is_empty(), "gcc gives a build-id");
    // The hottest sample's leaf is `leaf`, with a line number from DWARF.
    let hottest = p.sample.iter().max_by_key(|x| x.value[0]).expect("samples");
    let leaf = &p.location[hottest.location_id[0] as usize - 1];
    assert_eq!(leaf.mapping_id, chain_map.id);
    let line = leaf.line.last().unwrap();
    assert_eq!(s(p.function[line.function_id as usize - 1].name), "leaf");
    assert!(line.line > 0, "line number of leaf");
    pprof_top_lists_first(&pb, "leaf");
}

/// `pprof -top` reads `path`, and its first row is `function`.
fn pprof_top_lists_first(path: &Path, function: &str) {
    let Some(pprof) = support::pprof_tool() else {
        return;
    };
    let out = Command::new(&pprof)
        .args(["-top", "-sample_index=samples"])
        .arg(path)
        .env("PPROF_BINARY_PATH", "/nonexistent")
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run pprof");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pprof -top failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rows follow the `flat  flat%   sum%        cum   cum%` header.
    let first = stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rows in:\n{stdout}"));
    assert_eq!(
        first.split_whitespace().last(),
        Some(function),
        "pprof -top:\n{stdout}"
    );
}

/// Needs no BPF: a profile written by the library is read by Google's pprof.
#[test]
fn pprof_tool_reads_written_profile() {
    use sframe_common::WalkOutcome;
    use sframe_user::{
        export::{ProcessProfile, Profile, Stack, pprof_bytes},
        symbolize::Frame,
    };
    let f = |name: &str, offset: u64| {
        let mut frame = Frame::unknown("prog", offset, "");
        frame.name = Some(name.to_owned());
        frame.reason = None;
        frame.build_id = Some("0123456789abcdef".to_owned());
        frame
    };
    let stack = |names: &[(&str, u64)], count| Stack {
        tid: 0,
        thread: String::new(),
        user: names.iter().map(|&(n, o)| f(n, o)).collect(),
        kernel: Vec::new(),
        count,
        outcome: WalkOutcome::Complete,
        sleep: None,
    };
    let profile = Profile {
        processes: vec![ProcessProfile {
            deferred: Default::default(),
            ns_pid: None,
            cgroup: None,
            container_id: None,
            pid: 1,
            comm: "prog".to_owned(),
            stacks: vec![
                stack(&[("main", 0x100), ("hot", 0x200)], 90),
                stack(&[("main", 0x100), ("cold", 0x300)], 10),
            ],
        }],
        duration: Duration::from_secs(1),
        frequency: 100,
        ..Profile::default()
    };
    let path = support::fixture_dir("pprof-tool").join("p.pb.gz");
    std::fs::write(&path, pprof_bytes(&profile)).unwrap();
    pprof_top_lists_first(&path, "hot");
}
