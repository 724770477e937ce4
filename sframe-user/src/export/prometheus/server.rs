//! The HTTP side of the exporter: `GET /metrics` (and `HEAD`) only, on hyper's HTTP/1
//! server.
//!
//! The server never holds anything the profiler's loop needs: the loop swaps a new
//! exposition into [`Exposition`] (a pointer swap under a mutex), and each request takes
//! a reference-counted copy of the current one. Every resource a client can hold is
//! bounded by [`Limits`]: connections at once (more are closed as soon as they are
//! accepted), the size of a request head (431), the time to send one (which is also how
//! long an idle keep-alive connection stays open), and the life of a connection (then it
//! is shut down gracefully, and dropped after a grace period if a response is still
//! stuck in a client that does not read). Request bodies are never read.
//!
//! The exposition is OpenMetrics; a client that prefers the Prometheus text format
//! (`Accept: text/plain`, as `curl` users feeding `promtool check metrics` send) gets
//! that, converted once per exposition.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    HeaderMap, Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{ACCEPT, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};

pub use super::text_format::CONTENT_TYPE_TEXT;

/// OpenMetrics text exposition media type.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a client may hold. [`Limits::default`] is what the profiler uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; further ones are closed on accept.
    pub max_connections: usize,
    /// Largest request head (request line and headers); larger ones get 431.
    pub max_header_bytes: usize,
    /// Time to send a complete request head, counted from the connection's start or the
    /// end of the previous response: slow senders and idle keep-alive connections are
    /// closed after it.
    pub header_timeout: Duration,
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
            // hyper's read buffer holds at least 8 KiB; a scrape request is a few hundred
            // bytes.
            max_header_bytes: 8 * 1024,
            header_timeout: Duration::from_secs(5),
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

/// One exposition in both formats; the text format is made on first request.
#[derive(Debug, Default)]
struct Rendered {
    openmetrics: Bytes,
    text: OnceLock<Bytes>,
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
}

impl Exposition {
    /// Replaces the exposition (OpenMetrics text). Costs a pointer swap.
    pub fn set(&self, openmetrics: String) {
        let rendered = Arc::new(Rendered {
            openmetrics: Bytes::from(openmetrics),
            text: OnceLock::new(),
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
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            log::debug!("metrics server: too many connections, closing {peer}");
            continue;
        };
        let exposition = exposition.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let exposition = exposition.clone();
                async move { Ok::<_, Infallible>(respond(&req, &exposition)) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_header_size(limits.max_header_bytes)
                .max_buf_size(limits.max_header_bytes.max(8 * 1024))
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                () = tokio::time::sleep(limits.connection_lifetime) => {
                    conn.as_mut().graceful_shutdown();
                    match tokio::time::timeout(limits.shutdown_grace, conn.as_mut()).await {
                        Ok(result) => result,
                        Err(_) => {
                            log::debug!("metrics server: {peer}: dropped, response not read");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(err) = result {
                log::debug!("metrics server: {peer}: {err}");
            }
        });
    }
}

fn respond(req: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    route(req.method(), req.uri().path(), req.headers(), exposition)
}

/// The response for a request; the body of requests is never read.
fn route(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    exposition: &Exposition,
) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if path != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: only /metrics is served\n",
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
    let body_len = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if body_len.is_some_and(|n| n > 0) || headers.contains_key(hyper::header::TRANSFER_ENCODING) {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "GET /metrics takes no body\n",
        );
    }
    let rendered = exposition.current();
    let (body, content_type) = if prefers_text_format(headers) {
        (rendered.text(), CONTENT_TYPE_TEXT)
    } else {
        (rendered.openmetrics.clone(), CONTENT_TYPE_OPENMETRICS)
    };
    // hyper sends the length and no body for HEAD.
    let mut r = Response::new(Full::new(body));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
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
