//! Connections that keep moving data through the balancer while something
//! else happens (a daemon restart, a flood): client-driven request loops
//! and server pushes, each checked byte for byte, each remembering the
//! first error it met (a reset, a timeout, a wrong byte).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    netns::enter_ns,
    testbed::{connect, push_chunk, Conn, VIP},
};

/// What a mover does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Requests of 2 KiB answers, one every 5 ms (client sends, server answers).
    Requests,
    /// A server push of 1 KiB chunks every 5 ms (the client only reads).
    Push,
}

/// One connection moving data in its own thread.
pub struct Mover {
    /// What it does.
    pub kind: Kind,
    /// Bytes received and checked so far.
    pub bytes: Arc<AtomicU64>,
    /// The backend that answered.
    pub backend: Arc<Mutex<Option<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

const REQUEST_LEN: usize = 2048;
const PUSH_LEN: usize = 1024;
const PAUSE: Duration = Duration::from_millis(5);
/// Longest a mover waits for bytes before it counts the connection broken.
const STALL: Duration = Duration::from_secs(10);

impl Mover {
    /// Opens a connection to the VIP from the client namespace `ns` and
    /// starts moving data; returns once the first answer arrived.
    ///
    /// # Errors
    /// The connection or its first answer fails.
    pub fn start(ns: PathBuf, kind: Kind, id: u64) -> anyhow::Result<Mover> {
        let bytes = Arc::new(AtomicU64::new(0));
        let backend = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let sh = Shared {
            bytes: bytes.clone(),
            backend: backend.clone(),
            stop: stop.clone(),
        };
        let handle = thread::Builder::new()
            .name(format!("mover-{id}"))
            .stack_size(256 * 1024)
            .spawn(move || -> anyhow::Result<()> {
                enter_ns(&ns)?;
                match kind {
                    Kind::Requests => requests(id, &sh, tx),
                    Kind::Push => push(id, &sh, tx),
                }
            })?;
        match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(()) => Ok(Mover {
                kind,
                bytes,
                backend,
                stop,
                handle: Some(handle),
            }),
            Err(_) => {
                let r = handle.join();
                match r {
                    Ok(Err(e)) => Err(e.context(format!("mover {id} did not start"))),
                    _ => bail!("mover {id} did not start"),
                }
            }
        }
    }

    /// `true` once its thread has ended (a broken connection ends it).
    pub fn ended(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Stops moving data, closes the connection cleanly (FIN both ways)
    /// and returns the first error the connection met, if any.
    pub fn finish(mut self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Relaxed);
        let r = self.handle.take().map(|h| h.join());
        match r {
            Some(Ok(Ok(()))) => Ok(self.received()),
            Some(Ok(Err(e))) => Err(format!("{e:#}")),
            _ => Err("mover thread panicked".into()),
        }
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a mover's thread shares with its [`Mover`].
struct Shared {
    bytes: Arc<AtomicU64>,
    backend: Arc<Mutex<Option<SocketAddr>>>,
    stop: Arc<AtomicBool>,
}

fn requests(id: u64, sh: &Shared, started: std::sync::mpsc::Sender<()>) -> anyhow::Result<()> {
    let (bytes, backend, stop) = (&sh.bytes, &sh.backend, &sh.stop);
    let mut c = Conn::open(id << 20, REQUEST_LEN)?;
    *backend.lock().unwrap() = Some(c.backend);
    bytes.fetch_add(REQUEST_LEN as u64, Ordering::Relaxed);
    let _ = started.send(());
    let mut n = 1u64;
    while !stop.load(Ordering::Relaxed) {
        let b = c
            .request((id << 20) + n, REQUEST_LEN)
            .with_context(|| format!("request {n} of connection {id}"))?;
        if Some(b) != *backend.lock().unwrap() {
            bail!("connection {id} answered by {b}, first by another backend");
        }
        bytes.fetch_add(REQUEST_LEN as u64, Ordering::Relaxed);
        n += 1;
        thread::sleep(PAUSE);
    }
    c.close();
    Ok(())
}

fn push(id: u64, sh: &Shared, started: std::sync::mpsc::Sender<()>) -> anyhow::Result<()> {
    let (bytes, backend, stop) = (&sh.bytes, &sh.backend, &sh.stop);
    let s = connect(None, VIP, Duration::from_secs(10))?;
    s.set_read_timeout(Some(STALL))?;
    let mut w: TcpStream = s.try_clone()?;
    w.write_all(format!("PUSH {id} {PUSH_LEN}\n").as_bytes())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let Some(b) = line.strip_prefix("BACKEND ") else {
        bail!("unexpected answer {line:?}");
    };
    *backend.lock().unwrap() = Some(b.trim().parse()?);
    let _ = started.send(());
    let mut chunk = vec![0u8; PUSH_LEN];
    let mut k = 0u64;
    let mut closing = false;
    loop {
        if !closing && stop.load(Ordering::Relaxed) {
            // FIN; the server sends what is in flight, then its FIN.
            w.shutdown(std::net::Shutdown::Write)?;
            closing = true;
        }
        match r.read_exact(&mut chunk) {
            Ok(()) => {}
            Err(e) if closing && e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => {
                return Err(e).with_context(|| format!("push {id}, chunk {k}"));
            }
        }
        if chunk != push_chunk(id, k, PUSH_LEN) {
            bail!("push {id}: chunk {k} differs");
        }
        bytes.fetch_add(PUSH_LEN as u64, Ordering::Relaxed);
        k += 1;
    }
}

/// A set of movers.
pub struct Movers(pub Vec<Mover>);

impl Movers {
    /// Starts `requests` request loops and `pushes` server pushes from the
    /// client namespace `ns`, ids from `id_base`.
    ///
    /// # Errors
    /// One fails to start (the others are stopped).
    pub fn start(
        ns: &std::path::Path,
        requests: usize,
        pushes: usize,
        id_base: u64,
    ) -> anyhow::Result<Movers> {
        let mut v = Vec::new();
        for i in 0..requests + pushes {
            let kind = if i < requests {
                Kind::Requests
            } else {
                Kind::Push
            };
            v.push(Mover::start(ns.to_path_buf(), kind, id_base + i as u64)?);
        }
        Ok(Movers(v))
    }

    /// Bytes received by all.
    pub fn received(&self) -> u64 {
        self.0.iter().map(Mover::received).sum()
    }

    /// Waits until every mover received more than it had at the call,
    /// at most `within`; returns how many did not.
    pub fn all_progress(&self, within: Duration) -> usize {
        let before: Vec<u64> = self.0.iter().map(Mover::received).collect();
        let deadline = Instant::now() + within;
        loop {
            let stalled = self
                .0
                .iter()
                .zip(&before)
                .filter(|(m, b)| m.received() <= **b)
                .count();
            if stalled == 0 || Instant::now() >= deadline {
                return stalled;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops all and returns the errors met, one line per broken
    /// connection.
    pub fn finish(self) -> Vec<String> {
        self.0
            .into_iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let kind = m.kind;
                m.finish().err().map(|e| format!("{kind:?} {i}: {e}"))
            })
            .collect()
    }
}
