//! `sframe-user promql-flamegraph`: a flame graph of a window rebuilt from the stack
//! series in a Prometheus server (or anything that serves its HTTP query API: Thanos,
//! Mimir's Prometheus-compatible endpoint).
//!
//! The series of one host are its flame graph per program pruned to the significant
//! nodes (README, Prometheus): `increase()` of each over the window, summed by `comm` and
//! `stack`, gives folded lines `comm;frame;…;frame COUNT`, a remainder series giving a
//! `[other]` frame under the node it belongs to.

use std::{io::Write as _, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{Request, body::Bytes};
use hyper_util::rt::TokioIo;

use sframe_user::export::prometheus::{NO_FRAMES, OTHER, url_encode};

/// Largest answer read from the server.
const MAX_ANSWER_BYTES: usize = 256 << 20;
/// Longest wait for the whole answer.
const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Args, Debug)]
pub struct PromqlFlamegraphArgs {
    /// Base URL of the Prometheus HTTP API, e.g. http://prometheus:9090 (http only).
    #[arg(long, value_name = "URL")]
    pub prometheus_url: String,
    /// Window to rebuild, as a PromQL range ending at --time: 5m, 1h, 30s.
    #[arg(long, value_name = "RANGE", default_value = "5m")]
    pub window: String,
    /// Label matchers that choose the series, e.g. 'instance="host1:9464",comm="nginx"'.
    #[arg(long, value_name = "MATCHERS", default_value = "")]
    pub selector: String,
    /// End of the window (Unix seconds; default: now).
    #[arg(long, value_name = "SECS")]
    pub time: Option<f64>,
    /// The off-CPU series (sframe_off_cpu_seconds_total, counted in microseconds).
    #[arg(long)]
    pub off_cpu: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = GraphFormat::Svg)]
    pub format: GraphFormat,
    /// Where to write it (default: standard output).
    #[arg(long, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// An interactive SVG flame graph (inferno).
    Svg,
    /// Folded stacks, one `comm;frame;…;frame COUNT` line each.
    Folded,
}

/// The PromQL query of `args`.
pub fn query(args: &PromqlFlamegraphArgs) -> Result<String> {
    let metric = if args.off_cpu {
        "sframe_off_cpu_seconds_total"
    } else {
        "sframe_stack_samples_total"
    };
    let window = args.window.trim();
    if window.is_empty()
        || !window
            .chars()
            .all(|c| c.is_ascii_digit() || "smhdwy".contains(c))
    {
        bail!("--window must be a PromQL range such as 5m or 1h, not {window:?}");
    }
    if args.selector.contains(['{', '}']) {
        bail!("--selector takes label matchers without braces: 'instance=\"a\",comm=\"b\"'");
    }
    Ok(format!(
        "sum by (comm, stack) (increase({metric}{{{}}}[{window}]))",
        args.selector
    ))
}

pub async fn run(args: PromqlFlamegraphArgs) -> Result<()> {
    let promql = query(&args)?;
    let mut path = format!("/api/v1/query?query={}", url_encode(&promql));
    if let Some(t) = args.time {
        path.push_str(&format!("&time={t}"));
    }
    let body = tokio::time::timeout(TIMEOUT, get(&args.prometheus_url, &path))
        .await
        .with_context(|| format!("{} did not answer in {TIMEOUT:?}", args.prometheus_url))??;
    let lines = folded_from_answer(&body, args.off_cpu)?;
    let mut out = Vec::new();
    match args.format {
        GraphFormat::Folded => {
            for (stack, count) in &lines {
                writeln!(out, "{stack} {count}")?;
            }
        }
        GraphFormat::Svg => {
            let mut options = inferno::flamegraph::Options::default();
            options.title = format!("{} over {} (from Prometheus)", promql, args.window);
            options.count_name = if args.off_cpu { "us" } else { "samples" }.to_owned();
            let text: Vec<String> = lines.iter().map(|(s, c)| format!("{s} {c}")).collect();
            let placeholder = ["[no samples] 1".to_owned()];
            let text = if text.is_empty() {
                &placeholder[..]
            } else {
                &text[..]
            };
            inferno::flamegraph::from_lines(
                &mut options,
                text.iter().map(String::as_str),
                &mut out,
            )
            .context("drawing the flame graph")?;
        }
    }
    match &args.output {
        Some(p) => sframe_user::export::write_file_safely(p, &out)
            .with_context(|| format!("writing {}", p.display()))?,
        None => std::io::stdout().write_all(&out)?,
    }
    Ok(())
}

/// Folded lines (sorted, zeros left out) from a Prometheus query answer of vectors
/// labelled `comm` and `stack`.
pub fn folded_from_answer(body: &[u8], off_cpu: bool) -> Result<Vec<(String, u64)>> {
    let json: serde_json::Value =
        serde_json::from_slice(body).context("the server's answer is not JSON")?;
    if json["status"] != "success" {
        bail!(
            "the query failed: {} {}",
            json["errorType"].as_str().unwrap_or(""),
            json["error"].as_str().unwrap_or("")
        );
    }
    let Some(result) = json["data"]["result"].as_array() else {
        bail!("the answer has no data.result vector");
    };
    let mut lines = std::collections::BTreeMap::<String, u64>::new();
    for r in result {
        let comm = r["metric"]["comm"].as_str().unwrap_or(OTHER);
        let stack = r["metric"]["stack"].as_str().unwrap_or("");
        let Some(value) = r["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let value = if off_cpu { value * 1e6 } else { value };
        if !(value.is_finite() && value >= 0.5) {
            continue;
        }
        let clean = |s: &str| s.replace([' ', '\n'], "_");
        let mut line = clean(comm);
        if !(stack.is_empty() || stack == NO_FRAMES || (comm == OTHER && stack == OTHER)) {
            line.push(';');
            line.push_str(&clean(stack));
        }
        *lines.entry(line).or_default() += value.round() as u64;
    }
    Ok(lines.into_iter().collect())
}

/// `GET path` of the server at `base` (`http://host[:port][/prefix]`): the body of a
/// 200 answer, read up to [`MAX_ANSWER_BYTES`].
async fn get(base: &str, path: &str) -> Result<Vec<u8>> {
    let uri: hyper::Uri = base
        .parse()
        .with_context(|| format!("--prometheus-url {base:?} is not a URL"))?;
    if uri.scheme_str() != Some("http") {
        bail!("--prometheus-url must be http://HOST[:PORT] (https is not supported)");
    }
    let host = uri.host().context("--prometheus-url has no host")?;
    let port = uri.port_u16().unwrap_or(80);
    let prefix = uri.path().trim_end_matches('/');
    let stream = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .with_context(|| format!("connecting to {base}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    tokio::spawn(connection);
    let request = Request::get(format!("{prefix}{path}"))
        .header(
            hyper::header::HOST,
            uri.authority().map_or(host, |a| a.as_str()),
        )
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .context("building the request")?;
    let response = sender
        .send_request(request)
        .await
        .context("sending the query")?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
        .to_bytes();
    if !status.is_success() && status != hyper::StatusCode::BAD_REQUEST {
        bail!(
            "{base} answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(512)])
        );
    }
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_become_folded_lines() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"comm":"p","stack":"main;work"},"value":[1,"12.4"]},
            {"metric":{"comm":"p","stack":"main;[other]"},"value":[1,"3"]},
            {"metric":{"comm":"p","stack":"[no frames]"},"value":[1,"1"]},
            {"metric":{"comm":"[other]","stack":"[other]"},"value":[1,"7"]},
            {"metric":{"comm":"q","stack":"a b"},"value":[1,"0.2"]},
            {"metric":{"comm":"q","stack":"x"},"value":[1,"NaN"]}]}}"#;
        let lines = folded_from_answer(body, false).unwrap();
        assert_eq!(
            lines,
            [
                ("[other]".to_owned(), 7),
                ("p".to_owned(), 1),
                ("p;main;[other]".to_owned(), 3),
                ("p;main;work".to_owned(), 12),
            ]
        );
        let err = folded_from_answer(br#"{"status":"error","error":"bad"}"#, false);
        assert!(err.is_err());
        assert!(folded_from_answer(b"<html>", false).is_err());
    }

    #[test]
    fn queries_are_checked() {
        let args = |window: &str, selector: &str| PromqlFlamegraphArgs {
            prometheus_url: "http://x".into(),
            window: window.into(),
            selector: selector.into(),
            time: None,
            off_cpu: false,
            format: GraphFormat::Folded,
            output: None,
        };
        assert_eq!(
            query(&args("5m", "instance=\"a\"")).unwrap(),
            "sum by (comm, stack) (increase(sframe_stack_samples_total{instance=\"a\"}[5m]))"
        );
        assert!(query(&args("5m]) or vector(1", "")).is_err());
        assert!(query(&args("5m", "}")).is_err());
    }
}
