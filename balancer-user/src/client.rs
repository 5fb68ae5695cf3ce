//! The CLI side of the control API.

use std::path::Path;

use anyhow::{bail, Context as _};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::api::{Request, Response};

/// Sends one request to the daemon listening on `socket` and returns its
/// response.
///
/// # Errors
/// The daemon is not running (no socket, connection refused), permission
/// denied, or the answer is not a valid response.
pub async fn call(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    let stream = match UnixStream::connect(socket).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            bail!(
                "the balancer daemon is not running (no listener on {}); start it with `balancer run`",
                socket.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("connecting to {}", socket.display())),
    };
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    w.write_all(line.as_bytes()).await?;
    w.shutdown().await?;
    let mut reader = BufReader::new(r);
    let mut answer = String::new();
    reader.read_line(&mut answer).await?;
    if answer.is_empty() {
        bail!("the daemon closed the connection without answering");
    }
    serde_json::from_str(&answer).context("parsing the daemon's answer")
}
