//! The HTTP side of the exporter: `GET /metrics` only, on hyper's HTTP/1 server.
//!
//! Limits: at most [`MAX_CONNECTIONS`] connections at once (more are closed on accept),
//! request heads of at most [`MAX_REQUEST_BYTES`], no request bodies, and every
//! connection closed after [`CONNECTION_TIMEOUT`].

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore};

pub const MAX_CONNECTIONS: usize = 16;
/// hyper's smallest accepted read buffer is 8 KiB.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// OpenMetrics text exposition media type.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
pub struct Exposition(Arc<Mutex<Arc<str>>>);

impl Exposition {
    pub fn set(&self, text: String) {
        let text: Arc<str> = text.into();
        match self.0.lock() {
            Ok(mut guard) => *guard = text,
            Err(poisoned) => *poisoned.into_inner() = text,
        }
    }

    pub fn get(&self) -> Arc<str> {
        match self.0.lock() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

/// Listens on exactly `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serves `exposition` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, exposition: Exposition) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(err)) = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                log::debug!("metrics server: {peer}: {err}");
            }
        });
    }
}

fn respond(req: &Request<Incoming>, exposition: &Exposition) -> Response<Full<Bytes>> {
    let body_len = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    route(req.method(), req.uri().path(), body_len, exposition)
}

/// The response for a request; the body of requests is never read.
fn route(
    method: &Method,
    path: &str,
    body_len: Option<u64>,
    exposition: &Exposition,
) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            "text/plain; charset=utf-8".parse().expect("valid header"),
        );
        r
    };
    if path != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: only /metrics is served\n",
        );
    }
    if method != Method::GET {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(ALLOW, "GET".parse().expect("valid header"));
        return r;
    }
    if body_len.is_some_and(|n| n > 0) {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "GET /metrics takes no body\n",
        );
    }
    let text = exposition.get();
    let mut r = Response::new(Full::new(Bytes::from(text.as_bytes().to_vec())));
    r.headers_mut().insert(
        CONTENT_TYPE,
        CONTENT_TYPE_OPENMETRICS.parse().expect("valid header"),
    );
    r
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;

    /// Sends `request` raw and returns the whole response.
    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server may close before reading an oversized request.
        let _ = s.write_all(request);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_only_get_metrics() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let exposition = Exposition::default();
        exposition.set("x_total 1\n# EOF\n".to_owned());
        let server = tokio::spawn(serve(listener, exposition.clone()));
        let replies = tokio::task::spawn_blocking(move || {
            [
                "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned(),
                "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_owned(),
                "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
                "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc".to_owned(),
                format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024)),
            ]
            .map(|r| exchange(addr, r.as_bytes()))
        })
        .await
        .unwrap();
        server.abort();
        assert!(
            replies[0].starts_with("HTTP/1.1 200 OK\r\n"),
            "{}",
            replies[0]
        );
        assert!(
            replies[0].contains(CONTENT_TYPE_OPENMETRICS),
            "{}",
            replies[0]
        );
        assert!(
            replies[0].ends_with("\r\n\r\nx_total 1\n# EOF\n"),
            "{}",
            replies[0]
        );
        assert!(replies[1].starts_with("HTTP/1.1 404 "), "{}", replies[1]);
        assert!(replies[2].starts_with("HTTP/1.1 405 "), "{}", replies[2]);
        assert!(
            replies[2].to_ascii_lowercase().contains("allow: get\r\n"),
            "{}",
            replies[2]
        );
        assert!(replies[3].starts_with("HTTP/1.1 413 "), "{}", replies[3]);
        // An oversized head is refused (431) or the connection closed.
        assert!(
            replies[4].is_empty() || replies[4].starts_with("HTTP/1.1 431 "),
            "{}",
            replies[4]
        );
    }
}
