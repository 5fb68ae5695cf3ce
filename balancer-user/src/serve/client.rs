//! The CLI side of the control API: one HTTP/1.1 request per connection
//! to the daemon's unix socket (hyper's client), the route of each
//! [`Request`] from [`crate::serve::http::route`], the answer's body parsed as a
//! [`Response`].

use std::{path::Path, time::Duration};

use anyhow::{bail, Context as _};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use crate::{
    model::api::{Request, Response},
    serve::http::{route, DEADLINE_HEADER},
};

/// Default time the CLI waits for the daemon's answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read, bytes (10,000 flows take about 2 MB).
const MAX_ANSWER: usize = 64 << 20;

/// No daemon listens on the control socket.
#[derive(Debug, thiserror::Error)]
#[error(
    "the balancer daemon is not running (no listener on {socket}); start it with `balancer run`"
)]
pub struct NotRunning {
    /// The socket path tried.
    pub socket: String,
}

/// Sends one request to the daemon listening on `socket` and returns its
/// response, waiting at most [`DEFAULT_TIMEOUT`].
///
/// # Errors
/// See [`call_with_timeout`].
pub async fn call(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    call_with_timeout(socket, req, DEFAULT_TIMEOUT).await
}

/// Sends one request to the daemon listening on `socket` and returns its
/// response (an error answer is a `Response::Error`, not an `Err`). A
/// daemon serving its maximum of connections answers 503 (busy); the
/// request is then retried until `timeout`. The request carries its
/// deadline, so the daemon never starts it after the CLI gave up.
///
/// # Errors
/// [`NotRunning`] (no socket, connection refused), no answer within
/// `timeout` (a stopped or stuck daemon), permission denied, or an answer
/// that is not a valid response.
pub async fn call_with_timeout(
    socket: &Path,
    req: &Request,
    timeout: Duration,
) -> anyhow::Result<Response> {
    let deadline_ms = (std::time::SystemTime::now() + timeout)
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let attempt = async {
        let mut pause = Duration::from_millis(20);
        loop {
            match call_once(socket, req, deadline_ms).await? {
                Response::Error { status: 503, .. } => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                r => return Ok(r),
            }
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => bail!(
            "the daemon on {} did not answer within {} (stopped, or stuck; see its log). It \
             does not start a request after that time, so a change sent was not applied \
             unless it was already under way",
            socket.display(),
            humantime::format_duration(timeout)
        ),
    }
}

async fn connect(socket: &Path) -> anyhow::Result<UnixStream> {
    match UnixStream::connect(socket).await {
        Ok(s) => Ok(s),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(m) = std::fs::metadata(socket) {
                if !m.file_type().is_socket() {
                    let what = if m.is_dir() {
                        "a directory"
                    } else if m.is_file() {
                        "a regular file"
                    } else {
                        "not a socket"
                    };
                    bail!(
                        "{} is {what}, not the daemon's control socket (--socket names the path \
                         `balancer run --socket` listens on)",
                        socket.display()
                    );
                }
            }
            Err(NotRunning {
                socket: socket.display().to_string(),
            }
            .into())
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "permission denied on the control socket {}: it is for root only (a read-only \
             socket, when the daemon has one, serves its group)",
            socket.display()
        ),
        Err(e) => Err(e).with_context(|| format!("connecting to {}", socket.display())),
    }
}

/// The client's stream for a daemon that may answer before it reads: at
/// its connection cap (busy) or for a peer it refuses, the daemon writes
/// its answer at once and closes. hyper's client takes bytes that arrive
/// before its request is written for a protocol error, and a write after
/// the close fails (EPIPE) while the answer waits to be read. So reads
/// wait until the request has been written, and a write to a closed
/// socket drops its bytes (the failure is remembered) so that the answer
/// is read.
struct AnswerFirst {
    inner: UnixStream,
    write_failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Something was written (or dropped): reads may start.
    wrote: bool,
    /// The reader waiting for that.
    reader: Option<std::task::Waker>,
}

impl AnswerFirst {
    fn written(&mut self) {
        self.wrote = true;
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    fn gone(&self, e: &std::io::Error) -> bool {
        let gone = matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        );
        if gone {
            self.write_failed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        gone
    }
}

impl tokio::io::AsyncRead for AnswerFirst {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.wrote {
            self.reader = Some(cx.waker().clone());
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for AnswerFirst {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            std::task::Poll::Ready(Err(e)) if self.gone(&e) => {
                self.written();
                std::task::Poll::Ready(Ok(buf.len()))
            }
            std::task::Poll::Ready(Ok(n)) => {
                self.written();
                std::task::Poll::Ready(Ok(n))
            }
            r => r,
        }
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.inner).poll_flush(cx) {
            std::task::Poll::Ready(Err(e)) if self.gone(&e) => std::task::Poll::Ready(Ok(())),
            r => r,
        }
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.inner).poll_shutdown(cx) {
            std::task::Poll::Ready(Err(e)) if self.gone(&e) => std::task::Poll::Ready(Ok(())),
            r => r,
        }
    }
}

async fn call_once(socket: &Path, req: &Request, deadline_ms: u64) -> anyhow::Result<Response> {
    let write_failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stream = AnswerFirst {
        inner: connect(socket).await?,
        write_failed: write_failed.clone(),
        wrote: false,
        reader: None,
    };
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("starting HTTP on the control socket")?;
    let mut sender = sender;
    let (method, path, body) = route(req);
    let body = body.map_or_else(Vec::new, |b| serde_json::to_vec(&b).unwrap_or_default());
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(DEADLINE_HEADER, deadline_ms.to_string())
        .body(Full::new(Bytes::from(body)))
        .context("building the request")?;
    // Queued before the connection is first driven (hyper buffers one
    // request): a daemon that answers at once (busy) and closes must find
    // the request already on its way, or the early answer would end the
    // idle connection.
    let pending = sender.send_request(request);
    // The connection is driven beside the request; it ends with it.
    let mut driver = tokio::spawn(conn);
    let answer = pending.await;
    let result = match answer {
        Ok(resp) => {
            let status = resp.status();
            let bytes = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the daemon's answer: {e}"))?
                .to_bytes();
            parse_answer(status.as_u16(), &bytes)
        }
        // The daemon closed before reading the request and without an
        // answer (its connection cap, at the moment it accepted): the
        // request was not applied, so it is retried like a busy answer.
        Err(_) if write_failed.load(std::sync::atomic::Ordering::Relaxed) => Ok(Response::error(
            503,
            "the daemon closed the connection before reading",
        )),
        Err(e) if e.is_canceled() => {
            let why = match (&mut driver).await {
                Ok(Err(c)) => format!(" ({c})"),
                _ => String::new(),
            };
            bail!("the daemon closed the connection without answering{why}")
        }
        Err(e) if e.is_incomplete_message() => {
            bail!("the daemon closed the connection without answering ({e})")
        }
        Err(e) => Err(e).context("sending the request to the daemon"),
    };
    driver.abort();
    result
}

/// The [`Response`] of an answer with this status and body. An answer whose
/// body is not a `Response` (a proxy, another program on the socket) is an
/// error naming its status.
fn parse_answer(status: u16, body: &[u8]) -> anyhow::Result<Response> {
    match serde_json::from_slice::<Response>(body) {
        Ok(r) => Ok(r),
        Err(e) => bail!(
            "the daemon answered HTTP {status} with a body that is not an answer of this \
             version ({e}): {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_and_foreign_bodies_are_errors() {
        let r = parse_answer(
            404,
            br#"{"result":"error","message":"no VIP","status":404}"#,
        )
        .unwrap();
        assert!(matches!(r, Response::Error { status: 404, .. }));
        let e = parse_answer(502, b"<html>bad gateway</html>")
            .unwrap_err()
            .to_string();
        assert!(e.contains("502") && e.contains("bad gateway"), "{e}");
    }
}

#[cfg(test)]
mod wire_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A daemon at its connection cap answers 503 before reading and
    /// closes; one refusing the peer answers 403 the same way. The client
    /// retries the first and reports the second.
    #[tokio::test]
    async fn answers_given_before_reading_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let l = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            for _ in 0..3 {
                let (s, _) = l.accept().await.unwrap();
                let _ = s.try_write(&crate::serve::http::raw_answer(
                    503,
                    "Service Unavailable",
                    "busy",
                ));
            }
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            let body = br#"{"result":"ok"}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            s.write_all(body).await.unwrap();
            let (s, _) = l.accept().await.unwrap();
            let _ = s.try_write(&crate::serve::http::raw_answer(
                403,
                "Forbidden",
                "root only",
            ));
        });
        let r = call_with_timeout(&path, &Request::ListVips, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(matches!(r, Response::Ok), "{r:?}");
        let r = call_with_timeout(&path, &Request::ListVips, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(matches!(r, Response::Error { status: 403, .. }), "{r:?}");
        server.await.unwrap();
    }
}
