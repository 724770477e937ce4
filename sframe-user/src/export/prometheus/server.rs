//! The HTTP side of the exporter: `GET /metrics` (and `HEAD`), and `GET
//! /debug/pprof/profile?seconds=N` (the pull convention of Go's `net/http/pprof`, which
//! Parca, Grafana Alloy's `pyroscope.scrape` and `pprof` itself fetch) when the profiler
//! serves profiles, on hyper's HTTP/1 server.
//!
//! A profile request is handed to the profiler's loop ([`ProfileRequest`]), which
//! answers with the gzip pprof of the samples counted in the next N seconds (at most
//! [`MAX_PROFILE_SECONDS`]; [`MAX_PROFILES`] at once, further ones get 429). While it
//! waits, its connection is in its own phase: never taken for a slow one, dropped only
//! [`PROFILE_GRACE`] after the profile was due.
//!
//! The server never holds anything the profiler's loop needs: the loop swaps a new
//! exposition into [`Exposition`] (a pointer swap under a mutex), and each request takes
//! a reference-counted copy of the current one. Every resource a client can hold is
//! bounded by [`Limits`]: connections at once, the size of a request head (431), the time
//! to send one (which is also how long an idle keep-alive connection stays open), the
//! time to take a response, and the life of a connection (then it is shut down
//! gracefully, and dropped after a grace period if a response is still stuck in a client
//! that does not read). Request bodies are never read.
//!
//! Slots go to clients that use them: when every slot is taken, a new connection waits
//! in a first-come, first-served queue ([`Limits::max_waiting`] long; beyond it, it is
//! closed) and the one at its head takes the slot of a *slow* connection as soon as
//! there is one: the one that has waited longest for a request head, once that is over
//! [`Limits::slow_request`] (a slow sender or an idle keep-alive), else the one that has
//! been taking its response longest, once that is over [`Limits::slow_response`] (a
//! client that does not read). A scraper sends its request in microseconds and reads
//! its response at once; clients that hold slots without doing so lose them to it within
//! about a second, and one that reconnects goes to the back of the queue. So a scraper
//! keeps getting its answers while slow or silent clients saturate the limit.
//!
//! The exposition is OpenMetrics; a client that prefers the Prometheus text format
//! (`Accept: text/plain`, as `curl` users feeding `promtool check metrics` send) gets
//! that, converted once per exposition.

use std::{
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex, OnceLock},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{
    HeaderMap, Method, Request, Response, StatusCode,
    body::{Body, Bytes, Frame, Incoming, SizeHint},
    header::{ACCEPT, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::TcpListener,
    sync::{Notify, Semaphore, mpsc, oneshot},
};

pub use super::text_format::CONTENT_TYPE_TEXT;

/// OpenMetrics text exposition media type.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path of the pull endpoint of profiles.
pub const PPROF_PATH: &str = "/debug/pprof/profile";
/// The profile's length when the request gives none (Go's default).
pub const DEFAULT_PROFILE_SECONDS: u64 = 30;
/// The longest profile served.
pub const MAX_PROFILE_SECONDS: u64 = 300;
/// Profiles taken at once; further requests get 429.
pub const MAX_PROFILES: usize = 2;
/// How long after its due time a profile may take to be made (the loop's tick, then
/// symbolization) before its connection is dropped.
pub const PROFILE_GRACE: Duration = Duration::from_secs(60);

/// A request for the gzip pprof profile of the samples counted in the next `seconds`,
/// answered by the profiler's loop on `reply` (an error message if it could not be made).
#[derive(Debug)]
pub struct ProfileRequest {
    pub seconds: u64,
    /// The processes it keeps.
    pub filter: ProfileFilter,
    pub reply: oneshot::Sender<Result<Vec<u8>, String>>,
}

/// Values of one filter parameter of a profile request at most.
pub const MAX_FILTER_VALUES: usize = 16;

/// Which processes a pulled profile keeps: the `pid`, `comm` and `container` parameters
/// of its query, each repeatable. A process is kept if, for every parameter given, it
/// matches one of its values (a container by its id or a prefix of it, as `docker`
/// takes them); with none given, every process is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileFilter {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub containers: Vec<String>,
}

impl ProfileFilter {
    /// Whether the process `pid`, named `comm`, in container `container` is kept.
    pub fn keeps(&self, pid: u32, comm: &str, container: Option<&str>) -> bool {
        (self.pids.is_empty() || self.pids.contains(&pid))
            && (self.comms.is_empty() || self.comms.iter().any(|c| c == comm))
            && (self.containers.is_empty()
                || container.is_some_and(|id| self.containers.iter().any(|c| id.starts_with(c))))
    }
}

/// `value` with `+` and `%XX` escapes decoded (`None`: a bad escape or not UTF-8).
fn percent_decoded(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// Where the server sends profile requests; the profiler's loop holds the receiver.
pub type ProfileRequests = mpsc::Sender<ProfileRequest>;

/// What a client may hold. [`Limits::default`] is what the profiler uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; at the limit a new one waits for the slot of a slow
    /// one (see the module's documentation).
    pub max_connections: usize,
    /// Connections waiting for a slot; further ones are closed on accept.
    pub max_waiting: usize,
    /// A connection that has waited this long for a request head may lose its slot to a
    /// waiting one.
    pub slow_request: Duration,
    /// Largest request head (request line and headers); larger ones get 431.
    pub max_header_bytes: usize,
    /// Time to send a complete request head, counted from the connection's start or the
    /// end of the previous response: slow senders and idle keep-alive connections are
    /// closed after it.
    pub header_timeout: Duration,
    /// Time to take a whole response, from the end of the request head: then the
    /// connection is dropped.
    pub response_timeout: Duration,
    /// A connection whose response is still being written after this may lose its slot
    /// to a waiting one.
    pub slow_response: Duration,
    /// After this, a connection takes no further request and is closed once the response
    /// in progress (if any) is written.
    pub connection_lifetime: Duration,
    /// How long a response in progress may take after `connection_lifetime` (a client
    /// that does not read) before the connection is dropped.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 16,
            max_waiting: 64,
            slow_request: Duration::from_secs(1),
            // hyper's read buffer holds at least 8 KiB; a scrape request is a few hundred
            // bytes.
            max_header_bytes: 8 * 1024,
            header_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            slow_response: Duration::from_secs(1),
            connection_lifetime: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The latest exposition, shared by the profiler's loop (writer) and the server.
#[derive(Clone, Debug, Default)]
pub struct Exposition(Arc<Mutex<Arc<Rendered>>>);

/// One exposition in both formats, each plain or gzip-compressed (as Prometheus asks
/// for it: `Accept-Encoding: gzip`); each form is made on its first request.
#[derive(Debug, Default)]
struct Rendered {
    openmetrics: Bytes,
    text: OnceLock<Bytes>,
    openmetrics_gzip: OnceLock<Bytes>,
    text_gzip: OnceLock<Bytes>,
}

impl Rendered {
    fn text(&self) -> Bytes {
        self.text
            .get_or_init(|| {
                let om = std::str::from_utf8(&self.openmetrics).unwrap_or_default();
                Bytes::from(super::text_format::from_openmetrics(om))
            })
            .clone()
    }

    fn body(&self, text: bool, gzip: bool) -> Bytes {
        let plain = if text {
            self.text()
        } else {
            self.openmetrics.clone()
        };
        if !gzip {
            return plain;
        }
        let cell = if text {
            &self.text_gzip
        } else {
            &self.openmetrics_gzip
        };
        cell.get_or_init(|| {
            use std::io::Write as _;
            // The fastest level: an exposition is mostly repeated frame names.
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(plain.len() / 8),
                flate2::Compression::fast(),
            );
            // Writing into a Vec cannot fail.
            let _ = enc.write_all(&plain);
            Bytes::from(enc.finish().unwrap_or_default())
        })
        .clone()
    }
}

/// Whether the `Accept-Encoding` headers take gzip (not refused with `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(hyper::header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

impl Exposition {
    /// Replaces the exposition (OpenMetrics text). Costs a pointer swap.
    pub fn set(&self, openmetrics: String) {
        let rendered = Arc::new(Rendered {
            openmetrics: Bytes::from(openmetrics),
            ..Rendered::default()
        });
        // The old one is dropped outside the lock (after the guard).
        let _old = match self.0.lock() {
            Ok(mut guard) => std::mem::replace(&mut *guard, rendered),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), rendered),
        };
    }

    fn current(&self) -> Arc<Rendered> {
        match self.0.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The current exposition, OpenMetrics text.
    pub fn get(&self) -> Bytes {
        self.current().openmetrics.clone()
    }
}

/// Listens on exactly `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serves `exposition` on `listener` with the default [`Limits`] until the task is
/// dropped.
pub async fn serve(listener: TcpListener, exposition: Exposition) {
    serve_with(listener, exposition, Limits::default()).await
}

/// Serves `exposition` on `listener` within `limits` until the task is dropped.
pub async fn serve_with(listener: TcpListener, exposition: Exposition, limits: Limits) {
    serve_all(listener, exposition, limits, None).await
}

/// What the server did with its connections, for tests and health figures.
#[derive(Debug, Default)]
pub struct ServerFigures {
    /// Connections holding a slot now.
    pub connections: std::sync::atomic::AtomicUsize,
    /// Slots taken from slow connections (dropped) for new ones.
    pub slots_taken: std::sync::atomic::AtomicU64,
}

/// Serves `exposition` and, when `profiles` is given, profiles on `listener` within
/// `limits` until the task is dropped.
pub async fn serve_all(
    listener: TcpListener,
    exposition: Exposition,
    limits: Limits,
    profiles: Option<ProfileRequests>,
) {
    serve_counted(listener, exposition, limits, profiles, Arc::default()).await
}

/// [`serve_all`], counting in `figures`.
pub async fn serve_counted(
    listener: TcpListener,
    exposition: Exposition,
    limits: Limits,
    profiles: Option<ProfileRequests>,
    figures: Arc<ServerFigures>,
) {
    let permits = Arc::new(Semaphore::new(MAX_PROFILES));
    let slots = Slots::default();
    slots.table().figures = figures;
    let reaper = tokio::spawn(reap(slots.clone(), limits));
    let _stop_reaper = AbortOnDrop(reaper);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                // Out of descriptors and the like: back off instead of spinning.
                log::warn!("metrics server: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(ticket) = slots.enqueue(limits) else {
            log::debug!("metrics server: too many connections waiting, closing {peer}");
            continue;
        };
        let exposition = exposition.clone();
        let slots = slots.clone();
        let profiles = profiles.clone();
        let permits = permits.clone();
        tokio::spawn(async move {
            let slot = slots.admit(ticket, limits).await;
            let kill = slot.kill.clone();
            let id = slot.id;
            let service = {
                let slots = slots.clone();
                service_fn(move |req| {
                    let exposition = exposition.clone();
                    let slots = slots.clone();
                    let profiles = profiles.clone();
                    let permits = permits.clone();
                    async move {
                        let response = if req.uri().path() == PPROF_PATH {
                            let r = profile(&req, profiles.as_ref(), &permits, &slots, id).await;
                            slots.set_phase(id, Phase::Responding);
                            r
                        } else {
                            slots.set_phase(id, Phase::Responding);
                            respond(&req, &exposition)
                        };
                        Ok::<_, Infallible>(response.map(|body| Tracked {
                            body,
                            done: Some((slots, id)),
                        }))
                    }
                })
            };
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_header_size(limits.max_header_bytes)
                .max_buf_size(limits.max_header_bytes.max(8 * 1024))
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = kill.notified() => {
                    log::debug!("metrics server: {peer}: dropped (slow, or its slot was taken)");
                    Ok(())
                }
                () = tokio::time::sleep(limits.connection_lifetime) => {
                    conn.as_mut().graceful_shutdown();
                    // A profile being taken is let finish.
                    let grace = limits.shutdown_grace + slots.profiling_left(id);
                    tokio::select! {
                        result = conn.as_mut() => result,
                        () = kill.notified() => Ok(()),
                        () = tokio::time::sleep(grace) => {
                            log::debug!("metrics server: {peer}: dropped, response not read");
                            Ok(())
                        }
                    }
                }
            };
            slots.release(id);
            if let Err(err) = result {
                log::debug!("metrics server: {peer}: {err}");
            }
        });
    }
}

/// Aborts a task when dropped (the reaper ends with the server).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Drops connections whose response takes longer than `response_timeout`, and those
/// that have been in the head phase for a second longer than `header_timeout` (hyper
/// closes a slow sender itself, but not a connection whose last response is still
/// queued in its write buffer because the client does not read).
async fn reap(slots: Slots, limits: Limits) {
    let period = (limits.header_timeout.min(limits.response_timeout) / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(1));
    let head_limit = limits.header_timeout + Duration::from_secs(1);
    loop {
        tokio::time::sleep(period).await;
        slots.kill_where(|s, now| {
            let limit = match s.phase {
                Phase::Head => head_limit,
                Phase::Responding => limits.response_timeout,
                Phase::Profiling(until) => return now >= until,
            };
            now.duration_since(s.since) >= limit
        });
    }
}

/// What a connection is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request head (new, slow sender, or idle keep-alive).
    Head,
    /// A request was received; its response is being made or written.
    Responding,
    /// A profile is being taken, due to be answered before this (then dropped): never
    /// taken for a slow connection.
    Profiling(Instant),
}

#[derive(Debug)]
struct Slot {
    id: u64,
    phase: Phase,
    /// When the phase began.
    since: Instant,
    kill: Arc<Notify>,
}

/// The connections being served and those waiting for a slot; the `Notify` wakes the
/// waiting ones when a slot may have come free.
#[derive(Clone, Debug, Default)]
struct Slots(Arc<Mutex<SlotTable>>, Arc<Notify>);

#[derive(Debug, Default)]
struct SlotTable {
    next_id: u64,
    live: Vec<Slot>,
    waiting: std::collections::VecDeque<u64>,
    figures: Arc<ServerFigures>,
}

impl SlotTable {
    fn count_connections(&self) {
        self.figures
            .connections
            .store(self.live.len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes room for one more connection: `Ok` when there is a free slot or one held
    /// by a slow connection (which is dropped); else how long until one may turn slow.
    fn room(&mut self, now: Instant, limits: Limits) -> Result<(), Duration> {
        if self.live.len() < limits.max_connections.max(1) {
            return Ok(());
        }
        let oldest = |phase: Phase| {
            self.live
                .iter()
                .enumerate()
                .filter(|(_, s)| s.phase == phase)
                .min_by_key(|(_, s)| s.since)
                .map(|(i, s)| (i, now.duration_since(s.since)))
        };
        let head = oldest(Phase::Head);
        let responding = oldest(Phase::Responding);
        let victim = head
            .filter(|(_, age)| *age >= limits.slow_request)
            .or(responding.filter(|(_, age)| *age >= limits.slow_response));
        match victim {
            Some((i, _)) => {
                let evicted = self.live.swap_remove(i);
                self.figures
                    .slots_taken
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // notify_one keeps the wakeup if the task is not waiting yet.
                evicted.kill.notify_one();
                Ok(())
            }
            None => {
                let until = |o: Option<(usize, Duration)>, limit: Duration| {
                    o.map_or(limit, |(_, age)| limit.saturating_sub(age))
                };
                Err(until(head, limits.slow_request)
                    .min(until(responding, limits.slow_response))
                    .max(Duration::from_millis(1)))
            }
        }
    }
}

/// What an admitted connection keeps: its id and the signal that drops it.
struct Admitted {
    id: u64,
    kill: Arc<Notify>,
}

impl Slots {
    fn table(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place in the queue for a new connection (`None` when the queue is full).
    fn enqueue(&self, limits: Limits) -> Option<u64> {
        let mut t = self.table();
        if t.waiting.len() >= limits.max_waiting {
            return None;
        }
        t.next_id += 1;
        let id = t.next_id;
        t.waiting.push_back(id);
        Some(id)
    }

    /// Waits until `ticket` is first in the queue and a slot is free or held by a slow
    /// connection (which is then dropped), and takes it.
    async fn admit(&self, ticket: u64, limits: Limits) -> Admitted {
        /// Leaves the queue if the connection is dropped while waiting.
        struct Leave<'a>(&'a Slots, u64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let mut t = self.0.table();
                t.waiting.retain(|&w| w != self.1);
                drop(t);
                self.0.1.notify_waiters();
            }
        }
        let _leave = Leave(self, ticket);
        loop {
            // Registered before the check: a slot freed in between wakes it.
            let changed = self.1.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let wait = {
                let now = Instant::now();
                let mut t = self.table();
                if t.waiting.front() == Some(&ticket) {
                    match t.room(now, limits) {
                        Ok(()) => {
                            t.waiting.pop_front();
                            let kill = Arc::new(Notify::new());
                            t.live.push(Slot {
                                id: ticket,
                                phase: Phase::Head,
                                since: now,
                                kill: kill.clone(),
                            });
                            t.count_connections();
                            drop(t);
                            // The next in the queue may go on.
                            self.1.notify_waiters();
                            return Admitted { id: ticket, kill };
                        }
                        Err(until) => until,
                    }
                } else {
                    Duration::from_secs(1)
                }
            };
            let _ = tokio::time::timeout(wait, changed).await;
        }
    }

    fn set_phase(&self, id: u64, phase: Phase) {
        let mut t = self.table();
        if let Some(s) = t.live.iter_mut().find(|s| s.id == id) {
            s.phase = phase;
            s.since = Instant::now();
        }
        drop(t);
        if phase == Phase::Head {
            // An idle connection may be slow in a second: waiters recompute their wait.
            self.1.notify_waiters();
        }
    }

    /// How long until the profile connection `id` is taking is due to be answered (zero
    /// if it takes none).
    fn profiling_left(&self, id: u64) -> Duration {
        let t = self.table();
        match t.live.iter().find(|s| s.id == id).map(|s| s.phase) {
            Some(Phase::Profiling(until)) => until.saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    fn release(&self, id: u64) {
        let mut t = self.table();
        t.live.retain(|s| s.id != id);
        t.count_connections();
        drop(t);
        self.1.notify_waiters();
    }

    fn kill_where(&self, dead: impl Fn(&Slot, Instant) -> bool) {
        let now = Instant::now();
        let mut t = self.table();
        let before = t.live.len();
        t.live.retain(|s| {
            if dead(s, now) {
                s.kill.notify_one();
                false
            } else {
                true
            }
        });
        let freed = t.live.len() != before;
        t.count_connections();
        drop(t);
        if freed {
            self.1.notify_waiters();
        }
    }
}

/// A response body that puts its connection back in the head phase once hyper has
/// taken it all (or given up on it): hyper drops the body then. What hyper took may
/// still wait in its write buffer for a client that does not read; such a connection
/// is then the first to give its slot away.
struct Tracked {
    body: Full<Bytes>,
    done: Option<(Slots, u64)>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some((slots, id)) = self.done.take() {
            slots.set_phase(id, Phase::Head);
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

fn respond(req: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    route(req.method(), req.uri().path(), req.headers(), exposition)
}

/// A plain-text response.
fn plain(status: StatusCode, text: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(text.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Whether the request announces a body (which is never read).
fn has_body(headers: &HeaderMap) -> bool {
    let body_len = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    body_len.is_some_and(|n| n > 0) || headers.contains_key(hyper::header::TRANSFER_ENCODING)
}

/// The `seconds` of a profile request's query ([`DEFAULT_PROFILE_SECONDS`] when absent,
/// else an integer from 1 to [`MAX_PROFILE_SECONDS`]) and its filter: at most
/// [`MAX_FILTER_VALUES`] of each parameter, a pid a number, a command name at most 64
/// bytes, a container 1 to 64 lowercase hex digits. Other parameters are ignored, as
/// Go's `net/http/pprof` ignores them.
fn profile_query(query: Option<&str>) -> Result<(u64, ProfileFilter), String> {
    let mut seconds = DEFAULT_PROFILE_SECONDS;
    let mut filter = ProfileFilter::default();
    for pair in query.unwrap_or_default().split('&') {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = |what: &str| format!("{name} must be {what}\n");
        let value = || percent_decoded(raw).ok_or_else(|| bad("a well-formed query value"));
        let room = |n: usize| {
            if n < MAX_FILTER_VALUES {
                Ok(())
            } else {
                Err(bad(&format!("given at most {MAX_FILTER_VALUES} times")))
            }
        };
        match name {
            "seconds" => {
                seconds = raw
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_PROFILE_SECONDS).contains(s))
                    .ok_or_else(|| bad(&format!("an integer from 1 to {MAX_PROFILE_SECONDS}")))?;
            }
            "pid" => {
                room(filter.pids.len())?;
                let pid = raw.parse::<u32>().map_err(|_| bad("a process id"))?;
                filter.pids.push(pid);
            }
            "comm" => {
                room(filter.comms.len())?;
                let comm = value()?;
                if comm.is_empty() || comm.len() > 64 {
                    return Err(bad("a command name of 1 to 64 bytes"));
                }
                filter.comms.push(comm);
            }
            "container" => {
                room(filter.containers.len())?;
                let id = value()?;
                if id.is_empty()
                    || id.len() > 64
                    || !id
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(bad("a container id (or its prefix) in lowercase hex"));
                }
                filter.containers.push(id);
            }
            _ => {}
        }
    }
    Ok((seconds, filter))
}

/// `GET /debug/pprof/profile?seconds=N`: the gzip pprof of the next N seconds, from the
/// profiler's loop.
async fn profile(
    req: &Request<Incoming>,
    profiles: Option<&ProfileRequests>,
    permits: &Arc<Semaphore>,
    slots: &Slots,
    id: u64,
) -> Response<Full<Bytes>> {
    let Some(profiles) = profiles else {
        return plain(StatusCode::NOT_FOUND, "not found: no profiles are served\n");
    };
    if req.method() != Method::GET {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    if has_body(req.headers()) {
        return plain(StatusCode::PAYLOAD_TOO_LARGE, "GET takes no body\n");
    }
    let (seconds, filter) = match profile_query(req.uri().query()) {
        Ok(q) => q,
        Err(why) => return plain(StatusCode::BAD_REQUEST, why),
    };
    let Ok(_permit) = permits.clone().try_acquire_owned() else {
        let mut r = plain(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{MAX_PROFILES} profiles are being taken; try again later\n"),
        );
        r.headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
        return r;
    };
    slots.set_phase(
        id,
        Phase::Profiling(Instant::now() + Duration::from_secs(seconds) + PROFILE_GRACE),
    );
    let (reply, answer) = oneshot::channel();
    let stopping = || {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "the profiler is stopping\n",
        )
    };
    if profiles
        .send(ProfileRequest {
            seconds,
            filter,
            reply,
        })
        .await
        .is_err()
    {
        return stopping();
    }
    match answer.await {
        Ok(Ok(pprof)) => {
            let mut r = Response::new(Full::new(Bytes::from(pprof)));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r.headers_mut().insert(
                hyper::header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            r
        }
        Ok(Err(why)) => plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
        Err(_) => stopping(),
    }
}

/// The response for a request; the body of requests is never read.
fn route(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    exposition: &Exposition,
) -> Response<Full<Bytes>> {
    if path != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: only /metrics and /debug/pprof/profile are served\n",
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if has_body(headers) {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "GET /metrics takes no body\n",
        );
    }
    let rendered = exposition.current();
    let text = prefers_text_format(headers);
    let gzip = accepts_gzip(headers);
    let content_type = if text {
        CONTENT_TYPE_TEXT
    } else {
        CONTENT_TYPE_OPENMETRICS
    };
    // hyper sends the length and no body for HEAD.
    let mut r = Response::new(Full::new(rendered.body(text, gzip)));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if gzip {
        r.headers_mut().insert(
            hyper::header::CONTENT_ENCODING,
            HeaderValue::from_static("gzip"),
        );
    }
    r.headers_mut().insert(
        hyper::header::VARY,
        HeaderValue::from_static("Accept, Accept-Encoding"),
    );
    r
}

/// True when the `Accept` headers rank the Prometheus text format (`text/plain`) above
/// OpenMetrics. Without them, or on a tie, OpenMetrics.
fn prefers_text_format(headers: &HeaderMap) -> bool {
    // The quality of each format: from the most specific matching range.
    let mut openmetrics: Option<(u8, f32)> = None;
    let mut text: Option<(u8, f32)> = None;
    let mut any = false;
    for value in headers.get_all(ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            any = true;
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            let (om, txt) = match media.as_str() {
                "application/openmetrics-text" => (Some(2), None),
                "text/plain" => (None, Some(2)),
                "application/*" => (Some(1), None),
                "text/*" => (None, Some(1)),
                "*/*" => (Some(0), Some(0)),
                _ => (None, None),
            };
            let better = |slot: &mut Option<(u8, f32)>, specificity: Option<u8>| {
                if let Some(s) = specificity
                    && slot.is_none_or(|(best, _)| s > best)
                {
                    *slot = Some((s, q));
                }
            };
            better(&mut openmetrics, om);
            better(&mut text, txt);
        }
    }
    if !any {
        return false;
    }
    let q = |slot: Option<(u8, f32)>| slot.map_or(0.0, |(_, q)| q);
    q(text) > q(openmetrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(ACCEPT, v.parse().unwrap());
        }
        h
    }

    /// What Prometheus sends (`Accept-Encoding: gzip`) gets the exposition gzipped,
    /// and it decompresses to the same bytes; `identity` or `gzip;q=0` get it plain.
    #[test]
    fn profile_queries_are_bounded() {
        let seconds = |q| profile_query(q).map(|(s, _)| s);
        assert_eq!(seconds(None), Ok(DEFAULT_PROFILE_SECONDS));
        assert_eq!(seconds(Some("")), Ok(DEFAULT_PROFILE_SECONDS));
        assert_eq!(seconds(Some("seconds=5")), Ok(5));
        assert_eq!(seconds(Some("debug=1&seconds=300")), Ok(300));
        for bad in [
            "seconds=0",
            "seconds=301",
            "seconds=",
            "seconds=1.5",
            "seconds=-1",
            "pid=x",
            "pid=-1",
            "comm=",
            "comm=%zz",
            "comm=%ff",
            "container=ABC",
            "container=../x",
            "container=",
        ] {
            assert!(profile_query(Some(bad)).is_err(), "{bad}");
        }
        let many = vec!["pid=1"; MAX_FILTER_VALUES + 1].join("&");
        assert!(profile_query(Some(&many)).is_err());
        let (_, filter) = profile_query(Some(
            "seconds=3&pid=42&pid=43&comm=my+app%2F1&container=abc123",
        ))
        .unwrap();
        assert_eq!(
            filter,
            ProfileFilter {
                pids: vec![42, 43],
                comms: vec!["my app/1".into()],
                containers: vec!["abc123".into()],
            }
        );
    }

    #[test]
    fn filters_keep_processes_matching_every_parameter_given() {
        let all = ProfileFilter::default();
        assert!(all.keeps(1, "a", None));
        let f = ProfileFilter {
            pids: vec![1, 2],
            comms: vec!["a".into()],
            containers: vec![],
        };
        assert!(f.keeps(2, "a", None));
        assert!(!f.keeps(3, "a", None));
        assert!(!f.keeps(1, "b", None));
        let c = ProfileFilter {
            containers: vec!["abc".into()],
            ..ProfileFilter::default()
        };
        assert!(c.keeps(9, "x", Some("abcdef")));
        assert!(!c.keeps(9, "x", Some("fabc")));
        assert!(!c.keeps(9, "x", None));
    }

    #[test]
    fn gzip_when_asked_for() {
        use std::io::Read as _;
        let mut h = HeaderMap::new();
        h.append(hyper::header::ACCEPT_ENCODING, "gzip".parse().unwrap());
        assert!(accepts_gzip(&h));
        for refused in ["identity", "gzip;q=0", "br, deflate"] {
            let mut h = HeaderMap::new();
            h.append(hyper::header::ACCEPT_ENCODING, refused.parse().unwrap());
            assert!(!accepts_gzip(&h), "{refused}");
        }
        let om = "# TYPE a counter\na_total{stack=\"x;y\"} 1\n".repeat(100) + "# EOF\n";
        let exposition = Exposition::default();
        exposition.set(om.clone());
        let rendered = exposition.current();
        let gz = rendered.body(false, true);
        assert!(gz.len() < om.len() / 4, "{} of {}", gz.len(), om.len());
        let mut back = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, om);
        assert_eq!(rendered.body(false, false), om.as_bytes());
    }

    #[test]
    fn content_negotiation() {
        // Prometheus 2.42's scrape header.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (values, text) in [
            (&[][..], false),
            (&["*/*"][..], false),
            (&[prometheus][..], false),
            (&["text/plain"][..], true),
            (&["text/plain;version=0.0.4"][..], true),
            (&["text/*, application/openmetrics-text;q=0.5"][..], true),
            (
                &["application/openmetrics-text;q=0.5", "text/plain;q=0.6"][..],
                true,
            ),
            (&["application/json"][..], false),
            (&["text/plain;q=0, */*"][..], false),
            (&["TEXT/PLAIN ; q=0.9, */*;q=0.1"][..], true),
            (&["text/plain;q=garbage, application/*;q=0.5"][..], true),
        ] {
            assert_eq!(prefers_text_format(&accept(values)), text, "{values:?}");
        }
    }
}
