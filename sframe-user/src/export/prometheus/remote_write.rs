//! Prometheus remote write (1.0): the profiler's OpenMetrics exposition, pushed to a
//! remote-write endpoint (Prometheus with `--web.enable-remote-write-receiver`, Mimir,
//! Cortex, Thanos receive, VictoriaMetrics, an agent) instead of, or as well as, being
//! scraped.
//!
//! Three parts, each usable alone:
//! - [`parse_exposition`]: the samples of an OpenMetrics exposition, named as
//!   Prometheus stores them when it scrapes one (pure; malformed lines are skipped).
//! - [`encode`]: samples as a snappy-compressed (block format) protobuf
//!   `prometheus.WriteRequest` ([`proto`]), every series' labels sorted by name.
//! - [`RemoteWriter`]: a tokio task that ships expositions in order over HTTP/1.1
//!   (`http://` only: no TLS in the profiler; an agent or proxy on the host can add it).
//!
//! The profiler's loop only hands the text over ([`RemoteWriter::push`] never blocks
//! and never parses); the task parses and encodes on tokio's blocking pool and sends.
//! Memory is bounded by [`Config::max_queue`] expositions waiting plus the one being
//! sent: when the queue is full the oldest waiting one is dropped (and counted), also
//! while the endpoint is down and the task keeps retrying. Connection errors, timeouts,
//! 5xx and 429 are retried with capped, jittered exponential backoff; other statuses
//! (4xx: the endpoint will never take that request) drop the request.
//!
//! Not supported: TLS, remote write 2.0, metadata and exemplars, splitting an
//! exposition into several requests.

#![deny(missing_docs)]

use std::{
    collections::{BTreeSet, VecDeque},
    hash::{BuildHasher as _, Hasher as _},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{
    HeaderMap, Method, Request, StatusCode, Uri,
    body::Bytes,
    client::conn::http1::{self, SendRequest},
    header::{self, HeaderName, HeaderValue},
};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::{net::TcpStream, sync::Notify, task::JoinHandle};

/// The protobuf messages of Prometheus remote write 1.0 (`prometheus.WriteRequest` and
/// what it holds; metadata, exemplars and histograms are not sent).
pub mod proto {
    /// One request: any number of series.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WriteRequest {
        /// The series, each with its samples.
        #[prost(message, repeated, tag = "1")]
        pub timeseries: Vec<TimeSeries>,
    }

    /// One series: its labels (sorted by name, `__name__` included) and samples.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TimeSeries {
        /// The labels, sorted by name.
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<Label>,
        /// The samples, in time order.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
    }

    /// One label.
    #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
    pub struct Label {
        /// The label's name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// The label's value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// One sample.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// The value.
        #[prost(double, tag = "1")]
        pub value: f64,
        /// Milliseconds since the Unix epoch.
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }
}

/// Where and how to send. [`Config::new`] has the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The endpoint, `http://host[:port]/path` (Prometheus: `/api/v1/write`). `https://`
    /// is refused: the sender speaks no TLS.
    pub url: String,
    /// Headers sent with every request (`X-Scope-OrgID`, `Authorization`, ...). The
    /// ones remote write itself sets (`Content-Type`, `Content-Encoding`,
    /// `Content-Length`, `X-Prometheus-Remote-Write-Version`, `Host`,
    /// `Transfer-Encoding`, `Connection`) are refused; `User-Agent` replaces ours.
    pub headers: Vec<(String, String)>,
    /// Labels added to every series (`instance`, `job`, ...) unless the series already
    /// has a label of that name.
    pub external_labels: Vec<(String, String)>,
    /// Time one attempt may take: connecting, sending and receiving the response.
    pub timeout: Duration,
    /// Expositions waiting to be sent (at least 1); beyond it the oldest is dropped.
    pub max_queue: usize,
    /// Backoff after the first failed attempt of a request (at least 1 ms); it doubles
    /// per failure. Each wait is jittered down by up to half.
    pub min_backoff: Duration,
    /// Longest backoff between two attempts.
    pub max_backoff: Duration,
}

impl Config {
    /// `url` with no extra headers or labels, a 10 s timeout, 16 expositions queued,
    /// and backoff from 500 ms to 30 s.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            headers: Vec::new(),
            external_labels: Vec::new(),
            timeout: Duration::from_secs(10),
            max_queue: 16,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Why a [`RemoteWriter`] could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RemoteWriteError {
    /// The URL does not parse.
    #[error("remote-write URL {url:?} is not a valid URL")]
    BadUrl {
        /// The URL as configured.
        url: String,
        /// Why it does not parse.
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    /// An `https://` URL: the sender has no TLS.
    #[error(
        "remote-write URL {url:?} is https: only http:// is supported (put a TLS-terminating agent or proxy on the host)"
    )]
    Https {
        /// The URL as configured.
        url: String,
    },
    /// A URL that is not `http://host...`.
    #[error("remote-write URL {url:?} must be http://host[:port]/path ({reason})")]
    UnsupportedUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A header name that HTTP does not allow.
    #[error("remote-write header name {name:?} is invalid")]
    BadHeaderName {
        /// The name as configured.
        name: String,
        /// Why it is invalid.
        #[source]
        source: header::InvalidHeaderName,
    },
    /// A header value that HTTP does not allow (control characters, newlines).
    #[error("remote-write header {name:?} has an invalid value")]
    BadHeaderValue {
        /// The header's name.
        name: String,
        /// Why it is invalid.
        #[source]
        source: header::InvalidHeaderValue,
    },
    /// A header that remote write sets itself.
    #[error("remote-write header {name:?} is set by the sender and cannot be configured")]
    ReservedHeader {
        /// The header's name.
        name: String,
    },
    /// An external label Prometheus would not accept.
    #[error("external label {name:?}={value:?} is invalid: {reason}")]
    BadExternalLabel {
        /// The label's name.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// [`RemoteWriter::spawn`] was called outside a tokio runtime.
    #[error("the remote-write sender needs a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
}

/// One sample of an exposition: its name as Prometheus stores it, its labels in the
/// exposition's order (values unescaped), and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The sample's name (`x_total` for a counter `x`, `x_bucket`/`x_sum`/`x_count` for
    /// a histogram `x`).
    pub name: String,
    /// Its labels (`__name__` is not among them).
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

/// The samples of the OpenMetrics (or Prometheus text format) exposition `text`, up to
/// its `# EOF`. Lines that are not well-formed samples are skipped, as are samples
/// with a label named twice and the `_created` samples of counters, histograms and
/// summaries. Timestamps and exemplars in the text are ignored.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    // The family of the last `# TYPE`, and its type.
    let mut family: Option<(&str, &str)> = None;
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix('#') {
            if comment.trim_end() == " EOF" {
                break;
            }
            if let Some(rest) = comment.strip_prefix(" TYPE ") {
                let mut words = rest.split_ascii_whitespace();
                family = words.next().zip(words.next());
            }
            continue;
        }
        let Some(sample) = parse_sample(line) else {
            continue;
        };
        let is_created = family.is_some_and(|(name, kind)| {
            matches!(kind, "counter" | "histogram" | "summary" | "gaugehistogram")
                && sample.name.strip_prefix(name) == Some("_created")
        });
        if !is_created {
            samples.push(sample);
        }
    }
    samples
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`
fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `name{labels} value [timestamp] [# exemplar]`, or `None`.
fn parse_sample(line: &str) -> Option<Sample> {
    let name_len = line
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || b == b'_' || b == b':'))
        .unwrap_or(line.len());
    let (name, mut rest) = line.split_at_checked(name_len)?;
    if !is_metric_name(name) {
        return None;
    }
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        rest = parse_labels(inside, &mut labels)?;
    }
    // At least one blank between the series and its value.
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let mut words = rest.split_ascii_whitespace();
    let value = parse_value(words.next()?)?;
    match words.next() {
        None | Some("#") => {}
        Some(timestamp) => {
            parse_value(timestamp).filter(|t| t.is_finite())?;
            if !matches!(words.next(), None | Some("#")) {
                return None;
            }
        }
    }
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The labels after a `{`, up to and including the `}`; what follows it, or `None` for
/// a malformed label set.
fn parse_labels<'a>(mut rest: &'a str, labels: &mut Vec<(String, String)>) -> Option<&'a str> {
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some(after);
        }
        let name_len = rest
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(rest.len());
        let (name, after_name) = rest.split_at_checked(name_len)?;
        if !is_label_name(name) || name == "__name__" || labels.iter().any(|(n, _)| n == name) {
            return None;
        }
        let quoted = after_name.strip_prefix("=\"")?;
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()? {
                    (_, '\\') => value.push('\\'),
                    (_, '"') => value.push('"'),
                    (_, 'n') => value.push('\n'),
                    _ => return None,
                },
                (_, c) => value.push(c),
            }
        };
        // The closing quote is one byte.
        rest = quoted.get(end + 1..)?;
        labels.push((name.to_owned(), value));
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

/// A sample value or timestamp: a decimal float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(word: &str) -> Option<f64> {
    match word {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ if word.bytes().any(|b| b.is_ascii_digit())
            && word
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) =>
        {
            word.parse().ok()
        }
        _ => None,
    }
}

/// `samples` at `timestamp_ms` (ms since the Unix epoch) as a snappy-compressed (block
/// format) protobuf `WriteRequest`: one series per sample, its labels sorted by name
/// with `__name__` among them, `external_labels` added where the sample has no label of
/// that name. Labels with an empty value are left out (Prometheus treats them as
/// absent), and so are samples with an empty name; of series with the same labels,
/// the first is sent. Empty only if the request is over snappy's 4 GiB limit.
pub fn encode(
    samples: &[Sample],
    timestamp_ms: i64,
    external_labels: &[(String, String)],
) -> Vec<u8> {
    encode_counted(samples, timestamp_ms, external_labels).0
}

/// [`encode`], and the number of series sent.
fn encode_counted(
    samples: &[Sample],
    timestamp_ms: i64,
    external_labels: &[(String, String)],
) -> (Vec<u8>, usize) {
    let label = |name: &str, value: &str| proto::Label {
        name: name.to_owned(),
        value: value.to_owned(),
    };
    let mut series: Vec<proto::TimeSeries> = samples
        .iter()
        .filter(|s| !s.name.is_empty())
        .map(|s| {
            let mut labels = Vec::with_capacity(1 + s.labels.len() + external_labels.len());
            labels.push(label("__name__", &s.name));
            for (name, value) in &s.labels {
                if !value.is_empty() && name != "__name__" {
                    labels.push(label(name, value));
                }
            }
            for (name, value) in external_labels {
                if !value.is_empty()
                    && !s.labels.iter().any(|(n, _)| n == name)
                    && name != "__name__"
                {
                    labels.push(label(name, value));
                }
            }
            // Stable: of a name given twice, the first stays.
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            labels.dedup_by(|later, first| later.name == first.name);
            proto::TimeSeries {
                labels,
                samples: vec![proto::Sample {
                    value: s.value,
                    timestamp: timestamp_ms,
                }],
            }
        })
        .collect();
    // Two samples of one series at one timestamp would make the receiver reject the
    // whole request.
    series.sort_by(|a, b| a.labels.cmp(&b.labels));
    series.dedup_by(|later, first| later.labels == first.labels);
    let count = series.len();
    let raw = proto::WriteRequest { timeseries: series }.encode_to_vec();
    let compressed = snap::raw::Encoder::new()
        .compress_vec(&raw)
        .unwrap_or_default();
    (compressed, count)
}

/// What a [`RemoteWriter`] has done so far (counters since it started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests the endpoint took (2xx).
    pub requests_sent: u64,
    /// Samples in those requests.
    pub samples_sent: u64,
    /// Attempts that did not get a 2xx: connection errors, timeouts, 5xx, 429, and the
    /// rejections counted in `requests_rejected`.
    pub requests_failed: u64,
    /// Attempts that repeated an earlier one.
    pub requests_retried: u64,
    /// Expositions dropped unsent because `max_queue` newer ones were waiting.
    pub requests_dropped_queue_full: u64,
    /// Requests dropped because the endpoint refused them for good (4xx other than
    /// 429, any other non-2xx status that is not retried).
    pub requests_rejected: u64,
    /// When the last request was taken, in ms since the Unix epoch (0: never).
    pub last_success_unix_ms: u64,
    /// Expositions waiting now (not counting one being sent).
    pub queued: u64,
}

#[derive(Default)]
struct Counters {
    requests_sent: AtomicU64,
    samples_sent: AtomicU64,
    requests_failed: AtomicU64,
    requests_retried: AtomicU64,
    requests_dropped_queue_full: AtomicU64,
    requests_rejected: AtomicU64,
    last_success_unix_ms: AtomicU64,
}

/// An exposition waiting to be sent.
struct Pending {
    exposition: String,
    timestamp_ms: i64,
}

/// What the caller and the task share.
struct Shared {
    queue: Mutex<VecDeque<Pending>>,
    max_queue: usize,
    wake: Notify,
    counters: Counters,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Ships expositions to a remote-write endpoint from a tokio task; dropping it stops
/// the task (a request in flight is abandoned).
pub struct RemoteWriter {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for RemoteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWriter")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Headers remote write sets itself.
const RESERVED_HEADERS: [&str; 7] = [
    "host",
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "connection",
    "x-prometheus-remote-write-version",
];

/// Largest response body read (an error message); a longer one ends the connection.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

impl RemoteWriter {
    /// Checks `config` and starts the sending task on the current tokio runtime.
    pub fn spawn(config: Config) -> Result<Self, RemoteWriteError> {
        let endpoint = Endpoint::new(&config)?;
        for (name, value) in &config.external_labels {
            let bad = |reason| {
                Err(RemoteWriteError::BadExternalLabel {
                    name: name.clone(),
                    value: value.clone(),
                    reason,
                })
            };
            if !is_label_name(name) {
                return bad("names are [a-zA-Z_][a-zA-Z0-9_]*");
            }
            if name.starts_with("__") {
                return bad("names starting with __ are reserved");
            }
            if value.is_empty() {
                return bad("empty value");
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(RemoteWriteError::NoRuntime)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            max_queue: config.max_queue.max(1),
            wake: Notify::new(),
            counters: Counters::default(),
        });
        // Never a busy loop against a failing endpoint.
        let min_backoff = config.min_backoff.max(Duration::from_millis(1));
        let sender = Sender {
            shared: Arc::clone(&shared),
            endpoint,
            external_labels: config.external_labels.into(),
            timeout: config.timeout,
            min_backoff,
            max_backoff: config.max_backoff.max(min_backoff),
            conn: None,
            warned_statuses: BTreeSet::new(),
            failing: false,
            rng: Jitter::new(),
        };
        let task = runtime.spawn(sender.run());
        Ok(Self { shared, task })
    }

    /// Queues `exposition` (OpenMetrics text), whose samples are at `timestamp_ms` (ms
    /// since the Unix epoch), to be sent after those pushed before. Never blocks and
    /// does no parsing: when `max_queue` expositions are already waiting, the oldest
    /// one is dropped. An exposition without samples is not sent.
    pub fn push(&self, exposition: String, timestamp_ms: i64) {
        let dropped = {
            let mut queue = self.shared.queue();
            let dropped = if queue.len() >= self.shared.max_queue {
                queue.pop_front()
            } else {
                None
            };
            queue.push_back(Pending {
                exposition,
                timestamp_ms,
            });
            dropped
        };
        self.shared.wake.notify_one();
        // Freed outside the lock the task takes too.
        if dropped.is_some() {
            self.shared
                .counters
                .requests_dropped_queue_full
                .fetch_add(1, Relaxed);
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        Stats {
            requests_sent: c.requests_sent.load(Relaxed),
            samples_sent: c.samples_sent.load(Relaxed),
            requests_failed: c.requests_failed.load(Relaxed),
            requests_retried: c.requests_retried.load(Relaxed),
            requests_dropped_queue_full: c.requests_dropped_queue_full.load(Relaxed),
            requests_rejected: c.requests_rejected.load(Relaxed),
            last_success_unix_ms: c.last_success_unix_ms.load(Relaxed),
            queued: self.shared.queue().len() as u64,
        }
    }
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The checked URL and the headers of every request.
struct Endpoint {
    /// `host:port` to connect to (an IPv6 host without brackets).
    host: String,
    port: u16,
    /// The request target (path and query).
    target: Uri,
    headers: HeaderMap,
}

impl Endpoint {
    fn new(config: &Config) -> Result<Self, RemoteWriteError> {
        let url = &config.url;
        let unsupported = |reason| RemoteWriteError::UnsupportedUrl {
            url: url.clone(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|source| RemoteWriteError::BadUrl {
            url: url.clone(),
            source,
        })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(s) if s.eq_ignore_ascii_case("https") => {
                return Err(RemoteWriteError::Https { url: url.clone() });
            }
            Some(s) if s.eq_ignore_ascii_case("http") => {}
            _ => return Err(unsupported("the scheme must be http")),
        }
        let authority = uri.authority().ok_or_else(|| unsupported("no host"))?;
        if authority.as_str().contains('@') {
            return Err(unsupported(
                "credentials in the URL: send an Authorization header instead",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            return Err(unsupported("no host"));
        }
        let port = authority.port_u16().unwrap_or(80);
        let target: Uri = uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .parse()
            .map_err(|source| RemoteWriteError::BadUrl {
                url: url.clone(),
                source,
            })?;
        let mut headers = HeaderMap::new();
        let host_value = HeaderValue::from_str(authority.as_str()).map_err(|source| {
            RemoteWriteError::BadHeaderValue {
                name: "Host".to_owned(),
                source,
            }
        })?;
        headers.insert(header::HOST, host_value);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("snappy"));
        headers.insert(
            HeaderName::from_static("x-prometheus-remote-write-version"),
            HeaderValue::from_static("0.1.0"),
        );
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("sframe-user/", env!("CARGO_PKG_VERSION"))),
        );
        let mut user_agent_set = false;
        for (name, value) in &config.headers {
            let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|source| {
                RemoteWriteError::BadHeaderName {
                    name: name.clone(),
                    source,
                }
            })?;
            if RESERVED_HEADERS.contains(&header_name.as_str()) {
                return Err(RemoteWriteError::ReservedHeader { name: name.clone() });
            }
            let header_value = HeaderValue::from_str(value).map_err(|source| {
                RemoteWriteError::BadHeaderValue {
                    name: name.clone(),
                    source,
                }
            })?;
            if header_name == header::USER_AGENT && !user_agent_set {
                headers.remove(header::USER_AGENT);
                user_agent_set = true;
            }
            headers.append(header_name, header_value);
        }
        Ok(Self {
            host,
            port,
            target,
            headers,
        })
    }
}

/// A kept-alive connection; its driver task ends with it.
struct Connection {
    sender: SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Why an attempt got no response (logged, then retried).
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[source] hyper::Error),
    #[error("reading the response: {0}")]
    Body(String),
    #[error("no response within {0:?}")]
    Timeout(Duration),
}

/// A response: its status, its `Retry-After` (seconds form) and the start of its body.
struct Reply {
    status: StatusCode,
    retry_after: Option<Duration>,
    body: Bytes,
}

/// Backoff jitter: xorshift64*, seeded per writer.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self(seed | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `d` scaled by a random factor in [0.5, 1].
    fn apply(&mut self, d: Duration) -> Duration {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        // Cannot fail below `d`; `d` itself if rounding says otherwise.
        Duration::try_from_secs_f64(d.as_secs_f64() * (0.5 + unit / 2.0))
            .map_or(d, |jittered| jittered.min(d))
    }
}

/// The start of a response body, safe to log (the endpoint is not trusted).
fn excerpt(body: &[u8]) -> String {
    crate::sanitize::name_bytes(body.get(..body.len().min(512)).unwrap_or_default())
}

/// The task's state.
struct Sender {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    external_labels: Arc<[(String, String)]>,
    timeout: Duration,
    min_backoff: Duration,
    max_backoff: Duration,
    conn: Option<Connection>,
    /// Statuses already logged (at most the few hundred codes there are).
    warned_statuses: BTreeSet<u16>,
    /// Attempts have been failing since the last success (logged once per outage).
    failing: bool,
    rng: Jitter,
}

impl Sender {
    async fn run(mut self) {
        loop {
            let next = self.shared.queue().pop_front();
            let Some(pending) = next else {
                // A push between the pop and here leaves a permit: no lost wake-up.
                self.shared.wake.notified().await;
                continue;
            };
            let labels = Arc::clone(&self.external_labels);
            let encoded = tokio::task::spawn_blocking(move || {
                let samples = parse_exposition(&pending.exposition);
                encode_counted(&samples, pending.timestamp_ms, &labels)
            })
            .await;
            let Ok((body, count)) = encoded else {
                // The runtime is shutting down.
                return;
            };
            if count == 0 {
                continue;
            }
            if body.is_empty() {
                self.shared.counters.requests_rejected.fetch_add(1, Relaxed);
                log::warn!("remote write: request over snappy's size limit dropped");
                continue;
            }
            self.deliver(Bytes::from(body), count).await;
        }
    }

    /// Sends one request until it is taken or refused for good.
    async fn deliver(&mut self, body: Bytes, samples: usize) {
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        let mut backoff = self.min_backoff;
        let mut first = true;
        loop {
            if !first {
                counters.requests_retried.fetch_add(1, Relaxed);
            }
            first = false;
            let reply = match tokio::time::timeout(self.timeout, self.attempt(body.clone())).await {
                Ok(result) => result,
                Err(_) => {
                    self.conn = None;
                    Err(AttemptError::Timeout(self.timeout))
                }
            };
            let retry_after = match reply {
                Ok(reply) if reply.status.is_success() => {
                    counters.requests_sent.fetch_add(1, Relaxed);
                    counters.samples_sent.fetch_add(samples as u64, Relaxed);
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                    counters.last_success_unix_ms.store(now, Relaxed);
                    if self.failing {
                        log::info!("remote write: {} delivering again", self.url());
                        self.failing = false;
                    }
                    return;
                }
                Ok(reply)
                    if reply.status.is_server_error()
                        || reply.status == StatusCode::TOO_MANY_REQUESTS =>
                {
                    counters.requests_failed.fetch_add(1, Relaxed);
                    self.log_failure(&format!("status {}", reply.status), &reply.body);
                    reply.retry_after
                }
                Ok(reply) => {
                    counters.requests_failed.fetch_add(1, Relaxed);
                    counters.requests_rejected.fetch_add(1, Relaxed);
                    if self.warned_statuses.insert(reply.status.as_u16()) {
                        log::warn!(
                            "remote write: {} answered {}, request dropped (further requests dropped with this status are only counted): {}",
                            self.url(),
                            reply.status,
                            excerpt(&reply.body)
                        );
                    }
                    return;
                }
                Err(e) => {
                    self.conn = None;
                    counters.requests_failed.fetch_add(1, Relaxed);
                    self.log_failure(&e.to_string(), &[]);
                    None
                }
            };
            let mut wait = self.rng.apply(backoff);
            if let Some(asked) = retry_after {
                wait = wait.max(asked.min(self.max_backoff));
            }
            tokio::time::sleep(wait).await;
            backoff = backoff.saturating_mul(2).min(self.max_backoff);
        }
    }

    fn url(&self) -> String {
        format!(
            "http://{}{}",
            self.endpoint
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or_default(),
            self.endpoint.target
        )
    }

    /// Logs the first failure of an outage as a warning, the rest at debug level.
    fn log_failure(&mut self, what: &str, body: &[u8]) {
        let body = excerpt(body);
        if self.failing {
            log::debug!("remote write: {}: {what} {body}; retrying", self.url());
        } else {
            log::warn!(
                "remote write: {}: {what} {body}; retrying with backoff",
                self.url()
            );
            self.failing = true;
        }
    }

    /// One POST of `body`, on the kept-alive connection or a new one.
    async fn attempt(&mut self, body: Bytes) -> Result<Reply, AttemptError> {
        let mut conn = match self.conn.take() {
            // A kept-alive connection the endpoint has closed meanwhile is no failure.
            Some(mut conn) => match conn.sender.ready().await {
                Ok(()) => conn,
                Err(_) => self.connect().await?,
            },
            None => self.connect().await?,
        };
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.endpoint.target.clone();
        *request.headers_mut() = self.endpoint.headers.clone();
        let response = conn
            .sender
            .send_request(request)
            .await
            .map_err(AttemptError::Http)?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| AttemptError::Body(e.to_string()))?
            .to_bytes();
        // Whole response read: the connection can take the next request.
        self.conn = Some(conn);
        let retry_after = parts
            .headers
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        Ok(Reply {
            status: parts.status,
            retry_after,
            body,
        })
    }

    async fn connect(&self) -> Result<Connection, AttemptError> {
        let stream = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(AttemptError::Connect)?;
        // Requests are written whole; no reason to wait for more.
        stream.set_nodelay(true).map_err(AttemptError::Connect)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(AttemptError::Http)?;
        let driver = tokio::spawn(async move {
            if let Err(e) = connection.await {
                log::debug!("remote write: connection ended: {e}");
            }
        });
        Ok(Connection { sender, driver })
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, net::SocketAddr};

    use tokio::net::TcpListener;

    use super::*;

    /// `read` without tokio's `io-util` (not a dependency of the crate).
    async fn read(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            stream.readable().await?;
            match stream.try_read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                result => return result,
            }
        }
    }

    async fn write_all(stream: &TcpStream, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            stream.writable().await?;
            match stream.try_write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// What `Metrics::render` writes (escaped label values, counters with a unit, a
    /// histogram, gauges), with a `_created` sample and lines after `# EOF`.
    const EXPOSITION: &str = r#"# HELP sframe_stack_samples Samples per stack (folded, outermost first) of the top-K stacks of each process over a sliding window; the stack [other] sums the rest.
# TYPE sframe_stack_samples counter
sframe_stack_samples_total{comm="prog",pid="7",stack="main;work"} 5
sframe_stack_samples_total{comm="a\"b",pid="1",stack="x\\y;\"z\""} 1
sframe_stack_samples_total{comm="nl",pid="2",stack="two\nlines"} 2
# HELP sframe_off_cpu_seconds Time threads slept per stack.
# TYPE sframe_off_cpu_seconds counter
# UNIT sframe_off_cpu_seconds seconds
sframe_off_cpu_seconds_total{comm="prog",pid="7",stack="main;wait;[sleep S]"} 1.5
# HELP sframe_walk_outcomes Samples of target processes per stack walk outcome.
# TYPE sframe_walk_outcomes counter
sframe_walk_outcomes_total{outcome="complete"} 6
sframe_walk_outcomes_created{outcome="complete"} 1700000000.0
sframe_walk_outcomes_total{outcome="no_rule"} 0
# HELP sframe_stack_frames User frames per sampled stack.
# TYPE sframe_stack_frames histogram
sframe_stack_frames_sum 12.0
sframe_stack_frames_count 6
sframe_stack_frames_bucket{le="1.0"} 0
sframe_stack_frames_bucket{le="2.0"} 6
sframe_stack_frames_bucket{le="+Inf"} 6
# HELP sframe_objects_loaded Objects with unwind tables in the kernel.
# TYPE sframe_objects_loaded gauge
sframe_objects_loaded 3
# HELP sframe_table Kernel unwind table memory in use.
# TYPE sframe_table gauge
# UNIT sframe_table bytes
sframe_table_bytes 4096
# HELP sframe_event_lag_max Longest wait.
# TYPE sframe_event_lag_max gauge
sframe_event_lag_max{empty=""} NaN
# EOF
sframe_after_eof 1
"#;

    fn decode(bytes: &[u8]) -> proto::WriteRequest {
        let raw = snap::raw::Decoder::new()
            .decompress_vec(bytes)
            .expect("snappy block format");
        proto::WriteRequest::decode(raw.as_slice()).expect("a WriteRequest")
    }

    /// Each series as `name{a="1",b="2"}` (labels in the request's order) → (value, ts).
    fn by_series(request: &proto::WriteRequest) -> HashMap<String, (f64, i64)> {
        request
            .timeseries
            .iter()
            .map(|ts| {
                let name = &ts
                    .labels
                    .iter()
                    .find(|l| l.name == "__name__")
                    .unwrap()
                    .value;
                let labels: Vec<String> = ts
                    .labels
                    .iter()
                    .filter(|l| l.name != "__name__")
                    .map(|l| format!("{}={:?}", l.name, l.value))
                    .collect();
                assert_eq!(ts.samples.len(), 1);
                let s = &ts.samples[0];
                (
                    format!("{name}{{{}}}", labels.join(",")),
                    (s.value, s.timestamp),
                )
            })
            .collect()
    }

    fn owned(labels: &[(&str, &str)]) -> Vec<(String, String)> {
        labels
            .iter()
            .map(|&(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn exposition_parses_with_prometheus_names_and_unescaped_values() {
        let samples = parse_exposition(EXPOSITION);
        let names: Vec<&str> = samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "sframe_stack_samples_total",
                "sframe_stack_samples_total",
                "sframe_stack_samples_total",
                "sframe_off_cpu_seconds_total",
                "sframe_walk_outcomes_total",
                "sframe_walk_outcomes_total",
                "sframe_stack_frames_sum",
                "sframe_stack_frames_count",
                "sframe_stack_frames_bucket",
                "sframe_stack_frames_bucket",
                "sframe_stack_frames_bucket",
                "sframe_objects_loaded",
                "sframe_table_bytes",
                "sframe_event_lag_max",
            ]
        );
        assert_eq!(
            samples[1],
            Sample {
                name: "sframe_stack_samples_total".into(),
                labels: owned(&[("comm", "a\"b"), ("pid", "1"), ("stack", "x\\y;\"z\"")]),
                value: 1.0,
            }
        );
        assert_eq!(samples[2].labels[2].1, "two\nlines");
        assert_eq!(samples[10].labels, owned(&[("le", "+Inf")]));
        assert!(samples[13].value.is_nan());
    }

    #[test]
    fn parse_encode_decode_round_trip() {
        let samples = parse_exposition(EXPOSITION);
        let ts = 1_700_000_123_456;
        let request = decode(&encode(&samples, ts, &[]));
        let series = by_series(&request);
        // The empty label is left out; nothing else is lost.
        assert_eq!(series.len(), samples.len(), "{series:?}");
        for (key, value) in [
            (
                r#"sframe_stack_samples_total{comm="prog",pid="7",stack="main;work"}"#,
                5.0,
            ),
            (
                r#"sframe_stack_samples_total{comm="a\"b",pid="1",stack="x\\y;\"z\""}"#,
                1.0,
            ),
            (
                r#"sframe_stack_samples_total{comm="nl",pid="2",stack="two\nlines"}"#,
                2.0,
            ),
            (
                r#"sframe_off_cpu_seconds_total{comm="prog",pid="7",stack="main;wait;[sleep S]"}"#,
                1.5,
            ),
            (r#"sframe_walk_outcomes_total{outcome="complete"}"#, 6.0),
            ("sframe_stack_frames_sum{}", 12.0),
            ("sframe_stack_frames_count{}", 6.0),
            (r#"sframe_stack_frames_bucket{le="2.0"}"#, 6.0),
            (r#"sframe_stack_frames_bucket{le="+Inf"}"#, 6.0),
            ("sframe_objects_loaded{}", 3.0),
            ("sframe_table_bytes{}", 4096.0),
        ] {
            assert_eq!(series.get(key), Some(&(value, ts)), "{key} in {series:?}");
        }
        assert!(series["sframe_event_lag_max{}"].0.is_nan());
        assert!(
            !series
                .keys()
                .any(|k| k.contains("created") || k.contains("after_eof"))
        );
        // Raw protobuf too: every label set sorted by name, __name__ first here.
        for ts in &request.timeseries {
            assert_eq!(ts.labels[0].name, "__name__");
            assert!(
                ts.labels.windows(2).all(|w| w[0].name < w[1].name),
                "{ts:?}"
            );
        }
    }

    #[test]
    fn external_labels_are_added_not_overriding_and_labels_sorted() {
        let samples = vec![
            Sample {
                name: "zz_total".into(),
                labels: owned(&[("stack", "main"), ("job", "own"), ("a", "1")]),
                value: 1.0,
            },
            Sample {
                name: "up".into(),
                labels: vec![],
                value: 1.0,
            },
        ];
        let external = owned(&[("job", "sframe"), ("instance", "host:1"), ("zone", "z1")]);
        let request = decode(&encode(&samples, 5, &external));
        let labels = |i: usize| -> Vec<(String, String)> {
            request.timeseries[i]
                .labels
                .iter()
                .map(|l| (l.name.clone(), l.value.clone()))
                .collect()
        };
        let mut all: Vec<_> = (0..2).map(labels).collect();
        all.sort();
        assert_eq!(
            all,
            [
                owned(&[
                    ("__name__", "up"),
                    ("instance", "host:1"),
                    ("job", "sframe"),
                    ("zone", "z1"),
                ]),
                owned(&[
                    ("__name__", "zz_total"),
                    ("a", "1"),
                    ("instance", "host:1"),
                    ("job", "own"),
                    ("stack", "main"),
                    ("zone", "z1"),
                ]),
            ]
        );
    }

    #[test]
    fn duplicate_series_are_sent_once() {
        let sample = |value| Sample {
            name: "x".into(),
            labels: owned(&[("a", "1"), ("b", "")]),
            value,
        };
        let request = decode(&encode(&[sample(1.0), sample(2.0)], 1, &[]));
        assert_eq!(request.timeseries.len(), 1);
        assert_eq!(request.timeseries[0].samples[0].value, 1.0);
    }

    #[test]
    fn malformed_lines_are_skipped() {
        for line in [
            "",
            " x 1",
            "1x 1",
            "x",
            "x ",
            "x 1x",
            "x 0x10",
            "x 1 2 3",
            "x 1 nope",
            "x{ 1",
            "x{a=\"1\" 2",
            "x{a=\"1} 2",
            "x{a=1} 2",
            "x{a=\"1\"b=\"2\"} 3",
            "x{a=\"1\",a=\"2\"} 3",
            "x{__name__=\"y\"} 1",
            "x{1a=\"1\"} 1",
            "x{,} 1",
            "x{a=\"\\t\"} 1",
            "x{a=\"1\"}1",
            "x{a=\"\\",
            "x\u{e9} 1",
            "\u{1F980}{\"} 1",
            "{a=\"1\"} 1",
            "x{} ",
            "x{}{} 1",
        ] {
            assert_eq!(parse_exposition(line), [], "{line:?}");
        }
        // What is accepted around them.
        let ok = parse_exposition(
            "x{} 1\nx{a=\"1\",} 2\nx\t3 1700000000\nx 4 # {t=\"a b\"} 1\nx 1e3\nx -Inf\n\
             x{a=\"}\\\" #\"} 5 17 # {} 1\n",
        );
        let values: Vec<f64> = ok.iter().map(|s| s.value).collect();
        assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 1000.0, f64::NEG_INFINITY, 5.0]);
        assert_eq!(ok[6].labels, owned(&[("a", "}\" #")]));
    }

    /// Random mutations of a valid exposition: never a panic, and what comes out is
    /// well-formed.
    #[test]
    fn mutated_expositions_never_panic() {
        let mut rng = Jitter(0x9e37_79b9_7f4a_7c15);
        let mut next = |n: usize| -> usize { (rng.next_u64() % n.max(1) as u64) as usize };
        const INTERESTING: &[u8] = b"{}\",=\\ \n#\t_:aZ09.eE+-\xc3\xa9";
        let base = EXPOSITION.as_bytes();
        for _ in 0..3000 {
            let mut bytes = base.to_vec();
            for _ in 0..1 + next(8) {
                let at = next(bytes.len());
                match next(4) {
                    0 => bytes[at] = INTERESTING[next(INTERESTING.len())],
                    1 => bytes.insert(at, INTERESTING[next(INTERESTING.len())]),
                    2 => {
                        let end = (at + next(40)).min(bytes.len());
                        bytes.drain(at..end);
                    }
                    _ => bytes[at] = next(256) as u8,
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let samples = parse_exposition(&text);
            for s in &samples {
                assert!(is_metric_name(&s.name), "{s:?}");
                assert!(s.labels.iter().all(|(n, _)| is_label_name(n)), "{s:?}");
            }
            let request = decode(&encode(&samples, 1, &[]));
            assert!(request.timeseries.len() <= samples.len());
        }
        // Every prefix.
        for end in (0..=EXPOSITION.len()).filter(|&i| EXPOSITION.is_char_boundary(i)) {
            let _ = parse_exposition(&EXPOSITION[..end]);
        }
    }

    #[test]
    fn bad_configurations_are_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let guard = rt.enter();
        let spawn = |config: Config| RemoteWriter::spawn(config).err();
        assert!(matches!(
            spawn(Config::new("https://example.com/api/v1/write")),
            Some(RemoteWriteError::Https { .. })
        ));
        for url in ["ftp://h/x", "/api/v1/write", "http://user:pw@h/x"] {
            assert!(
                matches!(
                    spawn(Config::new(url)),
                    Some(RemoteWriteError::UnsupportedUrl { .. })
                ),
                "{url}"
            );
        }
        assert!(matches!(
            spawn(Config::new("http://a b/")),
            Some(RemoteWriteError::BadUrl { .. })
        ));
        let with_header = |name: &str, value: &str| Config {
            headers: owned(&[(name, value)]),
            ..Config::new("http://127.0.0.1:1/api/v1/write")
        };
        assert!(matches!(
            spawn(with_header("X Scope", "a")),
            Some(RemoteWriteError::BadHeaderName { .. })
        ));
        assert!(matches!(
            spawn(with_header("X-Scope-OrgID", "a\r\nb: c")),
            Some(RemoteWriteError::BadHeaderValue { .. })
        ));
        assert!(matches!(
            spawn(with_header("Content-Encoding", "gzip")),
            Some(RemoteWriteError::ReservedHeader { .. })
        ));
        for (name, value) in [("1job", "x"), ("__name__", "x"), ("job", "")] {
            let config = Config {
                external_labels: owned(&[(name, value)]),
                ..Config::new("http://127.0.0.1:1/api/v1/write")
            };
            assert!(
                matches!(
                    spawn(config),
                    Some(RemoteWriteError::BadExternalLabel { .. })
                ),
                "{name}"
            );
        }
        assert!(spawn(with_header("X-Scope-OrgID", "tenant-1")).is_none());
        drop(guard);
        // Outside a runtime.
        assert!(matches!(
            RemoteWriter::spawn(Config::new("http://127.0.0.1:1/")),
            Err(RemoteWriteError::NoRuntime(_))
        ));
        let message = RemoteWriteError::Https {
            url: "https://x/".into(),
        }
        .to_string();
        assert!(message.contains("only http://"), "{message}");
    }

    #[test]
    fn urls_give_host_port_and_target() {
        let endpoint = |url: &str| {
            let e = Endpoint::new(&Config::new(url)).unwrap();
            let host = e.headers[header::HOST].to_str().unwrap().to_owned();
            (e.host, e.port, e.target.to_string(), host)
        };
        assert_eq!(
            endpoint("http://[::1]:9090/api/v1/write?x=1"),
            (
                "::1".into(),
                9090,
                "/api/v1/write?x=1".into(),
                "[::1]:9090".into()
            )
        );
        assert_eq!(
            endpoint("http://mimir.local"),
            ("mimir.local".into(), 80, "/".into(), "mimir.local".into())
        );
        assert_eq!(endpoint("HTTP://h:1/w").1, 1);
        let e = Endpoint::new(&Config {
            headers: vec![("User-Agent".into(), "mine/1".into())],
            ..Config::new("http://h/")
        })
        .unwrap();
        assert_eq!(e.headers.get_all(header::USER_AGENT).iter().count(), 1);
        assert_eq!(e.headers[header::USER_AGENT], "mine/1");
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_backoff() {
        let mut jitter = Jitter::new();
        let d = Duration::from_millis(500);
        for _ in 0..1000 {
            let j = jitter.apply(d);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
        for d in [Duration::ZERO, Duration::MAX, Duration::from_nanos(1)] {
            assert!(jitter.apply(d) <= d);
        }
    }

    /// What the test server answers to one request.
    #[derive(Clone, Copy, Debug)]
    enum Answer {
        Status(u16),
        /// Reads the request and never answers.
        Silent,
    }

    /// A request the server received: lower-cased header names → values, and the body.
    #[derive(Debug)]
    struct Received {
        headers: HashMap<String, String>,
        target: String,
        body: Vec<u8>,
    }

    /// A minimal HTTP/1.1 server (keep-alive, Content-Length bodies) answering from a
    /// script, then 200.
    struct TestServer {
        addr: SocketAddr,
        received: Arc<Mutex<Vec<Received>>>,
        accept: JoinHandle<()>,
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            self.accept.abort();
        }
    }

    impl TestServer {
        async fn start(script: &[Answer]) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let received = Arc::new(Mutex::new(Vec::new()));
            let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
            let rec = Arc::clone(&received);
            let accept = tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    tokio::spawn(serve(stream, Arc::clone(&rec), Arc::clone(&script)));
                }
            });
            Self {
                addr,
                received,
                accept,
            }
        }

        fn url(&self) -> String {
            format!("http://{}/api/v1/write", self.addr)
        }

        fn count(&self) -> usize {
            self.received.lock().unwrap().len()
        }
    }

    async fn serve(
        stream: TcpStream,
        received: Arc<Mutex<Vec<Received>>>,
        script: Arc<Mutex<VecDeque<Answer>>>,
    ) {
        let mut buf = Vec::new();
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0; 4096];
                match read(&stream, &mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
            let mut lines = head.lines();
            let target = lines.next().unwrap().split(' ').nth(1).unwrap().to_owned();
            let headers: HashMap<String, String> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            let length: usize = headers["content-length"].parse().unwrap();
            while buf.len() < head_end + length {
                let mut chunk = [0; 4096];
                match read(&stream, &mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = buf[head_end..head_end + length].to_vec();
            buf.drain(..head_end + length);
            received.lock().unwrap().push(Received {
                headers,
                target,
                body,
            });
            let answer = script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Answer::Status(200));
            match answer {
                Answer::Status(status) => {
                    let body = if status == 200 { "" } else { "nope\n" };
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if write_all(&stream, response.as_bytes()).await.is_err() {
                        return;
                    }
                }
                Answer::Silent => {
                    // Hold the connection until the client gives up.
                    let mut sink = [0; 64];
                    while matches!(read(&stream, &mut sink).await, Ok(n) if n > 0) {}
                    return;
                }
            }
        }
    }

    fn fast_config(url: String) -> Config {
        Config {
            timeout: Duration::from_secs(5),
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
            ..Config::new(url)
        }
    }

    async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    const SMALL: &str = "# TYPE sframe_stack_samples counter\n\
        sframe_stack_samples_total{comm=\"prog\",stack=\"main;work\"} 42\n# EOF\n";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_carry_the_remote_write_headers_and_body() {
        let server = TestServer::start(&[]).await;
        let writer = RemoteWriter::spawn(Config {
            headers: owned(&[("X-Scope-OrgID", "tenant-1"), ("Authorization", "Bearer t")]),
            external_labels: owned(&[("instance", "host-a"), ("job", "sframe")]),
            ..fast_config(server.url())
        })
        .unwrap();
        writer.push(SMALL.to_owned(), 1_700_000_000_000);
        writer.push(SMALL.replace("42", "43"), 1_700_000_001_000);
        wait_until("2 sent", || writer.stats().requests_sent == 2).await;
        let received = server.received.lock().unwrap();
        assert_eq!(received.len(), 2);
        let r = &received[0];
        assert_eq!(r.target, "/api/v1/write");
        for (name, value) in [
            ("content-encoding", "snappy"),
            ("content-type", "application/x-protobuf"),
            ("x-prometheus-remote-write-version", "0.1.0"),
            (
                "user-agent",
                concat!("sframe-user/", env!("CARGO_PKG_VERSION")),
            ),
            ("x-scope-orgid", "tenant-1"),
            ("authorization", "Bearer t"),
            ("host", &server.addr.to_string()),
        ] {
            assert_eq!(
                r.headers.get(name).map(String::as_str),
                Some(value),
                "{name}"
            );
        }
        // In order, each with its timestamp.
        for (r, (value, ts)) in received
            .iter()
            .zip([(42.0, 1_700_000_000_000), (43.0, 1_700_000_001_000)])
        {
            let series = by_series(&decode(&r.body));
            assert_eq!(
                series,
                HashMap::from([(
                    r#"sframe_stack_samples_total{comm="prog",instance="host-a",job="sframe",stack="main;work"}"#
                        .to_owned(),
                    (value, ts)
                )])
            );
        }
        let stats = writer.stats();
        assert_eq!(stats.samples_sent, 2);
        assert_eq!(stats.requests_failed, 0);
        assert!(stats.last_success_unix_ms > 1_700_000_000_000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_errors_and_429_are_retried_and_delivered_once() {
        let server = TestServer::start(&[Answer::Status(500), Answer::Status(429)]).await;
        let writer = RemoteWriter::spawn(fast_config(server.url())).unwrap();
        writer.push(SMALL.to_owned(), 1_700_000_000_000);
        wait_until("sent", || writer.stats().requests_sent == 1).await;
        // Nothing more arrives.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let received = server.received.lock().unwrap();
        assert_eq!(received.len(), 3);
        assert!(received.iter().all(|r| r.body == received[0].body));
        let stats = writer.stats();
        assert_eq!(
            (
                stats.requests_sent,
                stats.requests_failed,
                stats.requests_retried,
                stats.requests_rejected
            ),
            (1, 2, 2, 0),
            "{stats:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn client_errors_are_not_retried() {
        let server = TestServer::start(&[Answer::Status(400), Answer::Status(400)]).await;
        let writer = RemoteWriter::spawn(fast_config(server.url())).unwrap();
        writer.push(SMALL.to_owned(), 1);
        writer.push(SMALL.to_owned(), 2);
        writer.push(SMALL.to_owned(), 3);
        wait_until("sent", || writer.stats().requests_sent == 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(server.count(), 3);
        let stats = writer.stats();
        assert_eq!(
            (
                stats.requests_sent,
                stats.requests_rejected,
                stats.requests_failed,
                stats.requests_retried
            ),
            (1, 2, 2, 0),
            "{stats:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_server_times_out_and_the_queue_stays_bounded() {
        let server = TestServer::start(&[Answer::Silent; 1000]).await;
        let writer = RemoteWriter::spawn(Config {
            timeout: Duration::from_millis(100),
            max_queue: 4,
            ..fast_config(server.url())
        })
        .unwrap();
        for i in 0..500 {
            writer.push(SMALL.to_owned(), i);
            assert!(writer.shared.queue().len() <= 4);
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        wait_until("timeouts", || writer.stats().requests_failed >= 3).await;
        let stats = writer.stats();
        assert_eq!(stats.requests_sent, 0, "{stats:?}");
        assert!(stats.queued <= 4, "{stats:?}");
        // All but the one being retried and the four waiting.
        assert!(stats.requests_dropped_queue_full >= 495, "{stats:?}");
        assert!(stats.requests_retried >= 2, "{stats:?}");
        // Each timed-out attempt was abandoned with its connection.
        assert!(server.count() >= 3);
        assert!(writer.shared.queue().capacity() < 64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_endpoint_is_retried_then_reached() {
        // A port nothing listens on, then a server on it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let writer =
            RemoteWriter::spawn(fast_config(format!("http://{addr}/api/v1/write"))).unwrap();
        writer.push(SMALL.to_owned(), 1);
        wait_until("connection refused", || writer.stats().requests_failed >= 2).await;
        let listener = TcpListener::bind(addr).await.unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let (stream, _) = listener.accept().await.unwrap();
        tokio::spawn(serve(stream, Arc::clone(&received), script));
        wait_until("sent", || writer.stats().requests_sent == 1).await;
        assert_eq!(received.lock().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_writer_stops_the_task() {
        let server = TestServer::start(&[Answer::Silent]).await;
        let writer = RemoteWriter::spawn(fast_config(server.url())).unwrap();
        writer.push(SMALL.to_owned(), 1);
        wait_until("request received", || server.count() == 1).await;
        let shared = Arc::downgrade(&writer.shared);
        drop(writer);
        wait_until("task gone", || shared.strong_count() == 0).await;
    }
}
