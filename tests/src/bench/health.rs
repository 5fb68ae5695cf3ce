//! Section 6: what active health checks cost the daemon: 1,000 backends
//! (loopback listeners in a runtime of their own) checked every second by
//! the daemon's own `health::Monitor`; CPU time of the checking threads only.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

use balancer::{
    model::state::{CheckKind, HealthCheck},
    signals::health::{Monitor, Target},
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Report, Scale};

/// CPU seconds (user + system) of this process's threads whose name starts
/// with `prefix` (from /proc/self/task/*/stat).
fn threads_cpu_s(prefix: &str) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|s| {
            s.split_once('(')
                .and_then(|(_, r)| r.split_once(')'))
                .is_some_and(|(name, _)| name.starts_with(prefix))
        })
        .map(|s| {
            let after = s.rsplit(')').next().unwrap_or("").to_string();
            let f: Vec<&str> = after.split_whitespace().collect();
            let u: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0);
            let st: f64 = f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
            (u + st) / 100.0
        })
        .sum()
}

/// `n` listeners on 127.0.0.1 answering each connection with an HTTP 200
/// and closing, in a runtime of their own (threads `bench-listen`).
fn listeners(n: usize) -> anyhow::Result<(tokio::runtime::Runtime, Vec<SocketAddr>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-listen")
        .enable_all()
        .build()?;
    let addrs = rt.block_on(async {
        let mut addrs = Vec::new();
        for _ in 0..n {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(l.local_addr()?);
            tokio::spawn(async move {
                while let Ok((mut s, _)) = l.accept().await {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 512];
                        let _ = s.read(&mut buf).await;
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                            .await;
                    });
                }
            });
        }
        anyhow::Ok(addrs)
    })?;
    Ok((rt, addrs))
}

/// The section.
///
/// # Errors
/// A runtime or socket failure.
pub fn run(rep: &mut Report, sc: Scale) -> anyhow::Result<()> {
    let n = 1000;
    let secs = if sc.rounds < 5 { 3 } else { 10 };
    let (_listen_rt, addrs) = listeners(n)?;
    let mut md = String::new();
    writeln!(md, "## 6. Health checks\n")?;
    writeln!(
        md,
        "{n} backends (loopback listeners in a runtime of their own) checked every second for {secs} s by the daemon's health monitor: one tokio task per backend on two worker threads, each check spread by up to 10 % of the interval. CPU is the user + system time of the checking threads only.\n"
    )?;
    writeln!(
        md,
        "| check | checks run | failed | CPU ms per s | CPU us per check |\n|---|---|---|---|---|"
    )?;
    let mut js = Vec::new();
    for (label, kind) in [
        ("TCP connect", CheckKind::Tcp {}),
        (
            "HTTP GET /health",
            CheckKind::Http {
                path: "/health".into(),
                status: 200,
            },
        ),
    ] {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bench-check")
            .enable_all()
            .build()?;
        let check = HealthCheck {
            kind,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            ..HealthCheck::default()
        };
        let vip: SocketAddr = "10.0.0.10:80".parse()?;
        let targets: Vec<Target> = addrs
            .iter()
            .map(|a| Target {
                vip,
                backend: *a,
                check: check.clone(),
                path: None,
            })
            .collect();
        let cpu0 = threads_cpu_s("bench-check");
        let (checks, failed) = rt.block_on(async {
            let (mut monitor, mut rx) = Monitor::new();
            monitor.sync(targets);
            let t0 = Instant::now();
            let (mut checks, mut failed) = (0u64, 0u64);
            let end = tokio::time::sleep(Duration::from_secs(secs));
            tokio::pin!(end);
            loop {
                tokio::select! {
                    o = rx.recv() => match o {
                        Some(o) => {
                            checks += 1;
                            if o.result.is_err() {
                                failed += 1;
                            }
                        }
                        None => break,
                    },
                    _ = &mut end => break,
                }
            }
            let _ = t0;
            drop(monitor);
            (checks, failed)
        });
        let cpu = threads_cpu_s("bench-check") - cpu0;
        drop(rt);
        let per_s = 1000.0 * cpu / secs as f64;
        let per_check = if checks > 0 {
            1e6 * cpu / checks as f64
        } else {
            0.0
        };
        writeln!(
            md,
            "| {label} | {checks} | {failed} | {per_s:.1} | {per_check:.1} |"
        )?;
        js.push(json!({"check": label, "backends": n, "seconds": secs, "checks": checks, "failed": failed, "cpu_ms_per_s": (per_s * 10.0).round() / 10.0, "cpu_us_per_check": (per_check * 10.0).round() / 10.0}));
    }
    writeln!(md)?;
    rep.section(6, &md);
    rep.json.insert("health_checks".into(), Value::Array(js));
    Ok(())
}
