//! The CLI side of the control API.

use std::{path::Path, time::Duration};

use anyhow::{bail, Context as _};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::{
    api::{Envelope, Request, Response},
    control::BUSY,
};

/// Default time the CLI waits for the daemon's answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

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
/// response. A daemon serving its maximum of connections answers "busy";
/// the request is then retried until `timeout`.
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
    let deadline = std::time::SystemTime::now() + timeout;
    let env = Envelope {
        deadline_unix_ms: deadline
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64),
        request: req.clone(),
    };
    let attempt = async {
        let mut pause = Duration::from_millis(20);
        loop {
            match call_once(socket, &env).await? {
                Response::Error { message } if message == BUSY => {
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

async fn call_once(socket: &Path, req: &Envelope) -> anyhow::Result<Response> {
    let stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(NotRunning {
                socket: socket.display().to_string(),
            }
            .into())
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "permission denied on the control socket {}: it is for root only",
            socket.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("connecting to {}", socket.display())),
    };
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    // A busy daemon answers and closes before reading: a failed write is
    // not the end, its answer may be waiting.
    let _ = w.write_all(line.as_bytes()).await;
    let _ = w.shutdown().await;
    let mut reader = BufReader::new(r);
    let mut answer = String::new();
    reader.read_line(&mut answer).await?;
    if answer.is_empty() {
        bail!("the daemon closed the connection without answering");
    }
    serde_json::from_str(&answer).context("parsing the daemon's answer")
}
