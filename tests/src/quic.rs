//! QUIC through the balancer with a well-kept implementation (quinn):
//! a server whose connection IDs carry its QUIC-LB server ID, and a probe
//! client whose connections change their source port (an active
//! migration, as after a NAT rebinding) and outlive the balancer's flow
//! table. Both run as helper processes of `balancer-testbed` inside the
//! test bed's namespaces (`quic-serve`, `quic-probe`); the scenario is in
//! `crate::udp`.
//!
//! The server answers each bidirectional stream with its own address and
//! what it read, so the probe knows which backend served each request.

use std::{
    io::BufRead as _,
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context as _};
use quinn::{
    rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    ConnectionId, ConnectionIdGenerator,
};
use rand::Rng as _;

/// The name the server's certificate holds.
pub const SERVER_NAME: &str = "vip.test";
/// Length of the connection IDs the server issues, octets.
pub const CID_LEN: usize = 8;

/// A self-signed certificate for [`SERVER_NAME`] and its key, written to
/// `dir` as `quic-cert.der` and `quic-key.der`.
///
/// # Errors
/// Generation or write failure.
pub fn make_certificate(dir: &Path) -> anyhow::Result<()> {
    let c = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])?;
    std::fs::write(dir.join("quic-cert.der"), c.cert.der())?;
    std::fs::write(dir.join("quic-key.der"), c.key_pair.serialize_der())?;
    Ok(())
}

/// Connection IDs in the QUIC-LB plaintext layout
/// (draft-ietf-quic-load-balancers section 5.2): a first octet with config
/// rotation bits 0 and the ID's length minus one, the server ID, then
/// random octets.
struct QuicLbCids {
    server_id: Vec<u8>,
}

impl ConnectionIdGenerator for QuicLbCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut b = [0u8; CID_LEN];
        b[0] = (CID_LEN - 1) as u8;
        b[1..1 + self.server_id.len()].copy_from_slice(&self.server_id);
        rand::thread_rng().fill(&mut b[1 + self.server_id.len()..]);
        ConnectionId::new(&b)
    }
    fn cid_len(&self) -> usize {
        CID_LEN
    }
    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The last `len` octets of `ip`: the server ID the balancer derives for a
/// backend at that address (`balancer_common::quic::server_id_of`).
fn server_id_bytes(ip: IpAddr, len: usize) -> Vec<u8> {
    let b = match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    b[16 - len..].to_vec()
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Serves QUIC on `listen` until killed, issuing connection IDs with a
/// server ID of `sid_len` octets (0: quinn's random IDs) taken from
/// `server_address` (the backend's own address, which it names in its
/// answers; `listen`'s address when `None`: a direct-return backend
/// listens on the VIP), sending stateless resets at most one per
/// `min_reset_interval`.
///
/// # Errors
/// Set-up failure.
pub fn serve(
    listen: SocketAddr,
    sid_len: usize,
    server_address: Option<IpAddr>,
    dir: &Path,
    min_reset_interval: Duration,
) -> anyhow::Result<()> {
    let me = server_address.unwrap_or(listen.ip());
    let cert = CertificateDer::from(std::fs::read(dir.join("quic-cert.der"))?);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(std::fs::read(
        dir.join("quic-key.der"),
    )?));
    let server = quinn::ServerConfig::with_single_cert(vec![cert], key)?;
    let mut config = quinn::EndpointConfig::default();
    config.min_reset_interval(min_reset_interval);
    if sid_len > 0 {
        let sid = server_id_bytes(me, sid_len);
        config.cid_generator(move || {
            Box::new(QuicLbCids {
                server_id: sid.clone(),
            })
        });
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let socket = std::net::UdpSocket::bind(listen)?;
        let endpoint =
            quinn::Endpoint::new(config, Some(server), socket, Arc::new(quinn::TokioRuntime))?;
        while let Some(incoming) = endpoint.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else {
                    return;
                };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let Ok(data) = recv.read_to_end(1024).await else {
                        break;
                    };
                    let answer = format!("{me} {}", String::from_utf8_lossy(&data));
                    if send.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                    let _ = send.finish();
                }
            });
        }
        Ok(())
    })
}

/// One request on `conn`: the server that answered.
async fn ask(conn: &quinn::Connection, what: &str) -> anyhow::Result<IpAddr> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(what.as_bytes()).await?;
    send.finish()?;
    let answer = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(1024))
        .await
        .context("no answer within 5 s")??;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let Some((server, echoed)) = text.split_once(' ') else {
        bail!("answer {text:?}");
    };
    if echoed != what {
        bail!("answer {text:?} to {what:?}");
    }
    Ok(server.parse()?)
}

/// Opens `n` connections to `vip` (each from an endpoint of its own, so
/// each on its own source port) and runs the phases, printing one line per
/// connection and phase (`quic-probe: phase P conn I: SERVER` or
/// `... FAILED: why`):
/// 1. `opened`: one request each;
/// 2. `rebound`: every endpoint moves to a new UDP socket (a new source
///    port: an active migration), then one request each;
/// 3. `after`: after a line on stdin (the scenario empties the balancer's
///    flow tables meanwhile), one request each.
///
/// # Errors
/// Set-up failure (a failed request is printed, not an error).
pub fn probe(vip: SocketAddr, n: usize, dir: &Path) -> anyhow::Result<()> {
    let cert = CertificateDer::from(std::fs::read(dir.join("quic-cert.der"))?);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert)?;
    let client = quinn::ClientConfig::with_root_certificates(Arc::new(roots))?;
    let rt = runtime()?;
    rt.block_on(async move {
        let mut conns = Vec::new();
        for i in 0..n {
            let mut ep = quinn::Endpoint::client("0.0.0.0:0".parse()?)?;
            ep.set_default_client_config(client.clone());
            let conn =
                match tokio::time::timeout(Duration::from_secs(5), ep.connect(vip, SERVER_NAME)?)
                    .await
                {
                    Ok(Ok(c)) => Some(c),
                    Ok(Err(e)) => {
                        println!("quic-probe: phase opened conn {i}: FAILED: {e}");
                        None
                    }
                    Err(_) => {
                        println!("quic-probe: phase opened conn {i}: FAILED: no handshake in 5 s");
                        None
                    }
                };
            conns.push((ep, conn));
        }
        for phase in ["opened", "rebound", "after"] {
            if phase == "rebound" {
                for (ep, _) in &conns {
                    ep.rebind(std::net::UdpSocket::bind("0.0.0.0:0")?)?;
                }
            }
            if phase == "after" {
                println!("quic-probe: waiting");
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line)?;
            }
            for (i, (ep, conn)) in conns.iter().enumerate() {
                let Some(conn) = conn else {
                    continue;
                };
                let port = ep.local_addr().map(|a| a.port()).unwrap_or(0);
                match ask(conn, &format!("{phase} {i}")).await {
                    Ok(s) => println!("quic-probe: phase {phase} conn {i}: {s} (port {port})"),
                    Err(e) => println!("quic-probe: phase {phase} conn {i}: FAILED: {e:#}"),
                }
            }
        }
        for (ep, conn) in &conns {
            if let Some(c) = conn {
                c.close(0u32.into(), b"done");
            }
            ep.wait_idle().await;
        }
        Ok(())
    })
}

/// The VIP of Debian's ngtcp2 servers (placed by 5-tuple).
pub const NGTCP2_VIP: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 54)), 443);
/// The VIP of the quinn servers (QUIC-LB server IDs of 2 octets).
pub const QUINN_VIP: SocketAddr =
    SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 55)), 443);
/// Backends.
const BACKENDS: usize = 3;
/// ngtcp2's port on the backends.
const NGTCP2_PORT: u16 = 4433;
/// quinn's port on the backends.
const QUINN_PORT: u16 = 443;
/// ngtcp2 downloads.
const DOWNLOADS: usize = 30;
/// quinn connections of the probe.
const PROBED: usize = 6;

fn backend_ip(k: usize) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 2, 10 + k as u8))
}

/// What one probe printed: by phase, each connection's server (`None`:
/// failed).
pub(crate) type Probed = std::collections::BTreeMap<String, Vec<Option<IpAddr>>>;

/// Runs the quinn probe (`n` connections to `vip`) in namespace `ns`,
/// calling `on_wait` when it waits between its second and third phase;
/// returns what it saw.
///
/// # Errors
/// The probe fails to start or exits with an error, or `on_wait` fails.
pub(crate) fn run_probe(
    ns: &crate::netns::Netns,
    vip: SocketAddr,
    n: usize,
    dir: &Path,
    mut on_wait: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Probed> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new("timeout");
    cmd.args(["90", "ip", "netns", "exec", ns.name()])
        .arg(&exe)
        .args([
            "quic-probe",
            "--vip",
            &vip.to_string(),
            "--connections",
            &n.to_string(),
            "--dir",
            &dir.to_string_lossy(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    crate::testbed::dies_with_us(&mut cmd);
    let mut child = cmd.spawn().context("starting the quinn probe")?;
    let stdout = child.stdout.take().context("probe stdout")?;
    let mut stdin = child.stdin.take().context("probe stdin")?;
    let mut seen = Probed::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if line == "quic-probe: waiting" {
            on_wait()?;
            writeln!(stdin)?;
            continue;
        }
        // "quic-probe: phase P conn I: SERVER (port N)" or "...: FAILED: why"
        let Some(rest) = line.strip_prefix("quic-probe: phase ") else {
            continue;
        };
        let Some((phase, rest)) = rest.split_once(" conn ") else {
            continue;
        };
        let Some((i, what)) = rest.split_once(": ") else {
            continue;
        };
        let i: usize = i.parse()?;
        let server = what.split_whitespace().next().and_then(|s| s.parse().ok());
        let v = seen
            .entry(phase.to_string())
            .or_insert_with(|| vec![None; n]);
        if let Some(slot) = v.get_mut(i) {
            *slot = server;
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("the quinn probe exited with {status}");
    }
    Ok(seen)
}

/// Connections that answered in every phase from the server of their
/// first answer.
pub(crate) fn kept(p: &Probed) -> usize {
    let first = p.get("opened").cloned().unwrap_or_default();
    (0..first.len())
        .filter(|i| {
            let Some(Some(s)) = first.get(*i) else {
                return false;
            };
            ["rebound", "after"]
                .iter()
                .all(|ph| p.get(*ph).and_then(|v| v.get(*i).copied().flatten()) == Some(*s))
        })
        .count()
}

/// The scenario: ngtcp2 downloads through a UDP VIP (5-tuple placement),
/// then quinn connections through a QUIC-LB VIP that change their source
/// port and outlive an emptied flow table; the control: the same without
/// QUIC-LB breaks connections.
///
/// # Errors
/// A check that fails.
pub fn run() -> anyhow::Result<()> {
    use crate::realclients::spawn_in;
    let mut tb = crate::testbed::Testbed::start(BACKENDS, "2")?;
    let dir = tb.dir().to_path_buf();
    make_certificate(&dir)?;
    let (cert_pem, key_pem) = (dir.join("quic-cert.pem"), dir.join("quic-key.pem"));
    // ngtcp2's example server reads PEM: the same certificate converted.
    for (der, pem, kind) in [
        ("quic-cert.der", &cert_pem, "x509"),
        ("quic-key.der", &key_pem, "pkey"),
    ] {
        let out = std::process::Command::new("openssl")
            .args([kind, "-inform", "DER", "-in"])
            .arg(dir.join(der))
            .arg("-out")
            .arg(pem)
            .output()?;
        if !out.status.success() {
            bail!("openssl {kind}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let blob: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let exe = std::env::current_exe()?;
    let mut procs = Vec::new();
    for k in 0..BACKENDS {
        let www = dir.join(format!("www-{k}"));
        std::fs::create_dir_all(&www)?;
        std::fs::write(www.join("blob"), &blob)?;
        std::fs::write(www.join("id"), format!("backend {k}"))?;
        let ns = &tb.backends[k];
        procs.push(spawn_in(
            ns,
            "gtlsserver",
            &[
                "--quiet",
                "-d",
                &www.to_string_lossy(),
                &backend_ip(k).to_string(),
                &NGTCP2_PORT.to_string(),
                &key_pem.to_string_lossy(),
                &cert_pem.to_string_lossy(),
            ],
        )?);
        procs.push(spawn_in(
            ns,
            &exe.to_string_lossy(),
            &[
                "quic-serve",
                "--listen",
                &SocketAddr::new(backend_ip(k), QUINN_PORT).to_string(),
                "--sid-len",
                "2",
                "--dir",
                &dir.to_string_lossy(),
            ],
        )?);
    }
    crate::realclients::await_listeners(&tb.backends, true, &[NGTCP2_PORT, QUINN_PORT])?;
    let r = run_on(&mut tb, &dir, &blob);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r?;
    // The servers go with their handles: none is left.
    let running = crate::realclients::processes_in(&tb.backends, "gtlsserver")?.len();
    if running != BACKENDS {
        bail!("control: {running} gtlsserver processes seen while {BACKENDS} run");
    }
    drop(procs);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut left = crate::realclients::processes_in(&tb.backends, "gtlsserver")?;
        // The quinn servers: this program's name, as the kernel cuts it.
        left.extend(crate::realclients::processes_in(
            &tb.backends,
            "balancer-testbe",
        )?);
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!("QUIC servers left: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("quic: no QUIC server left");
    Ok(())
}

fn run_on(tb: &mut crate::testbed::Testbed, dir: &Path, blob: &[u8]) -> anyhow::Result<()> {
    use crate::realclients::client;
    let (nv, qv) = (NGTCP2_VIP.to_string(), QUINN_VIP.to_string());
    tb.cli(&["vip", "add", &nv, "--protocol", "udp", "--health", "off"])?;
    tb.cli(&[
        "vip",
        "add",
        &qv,
        "--protocol",
        "udp",
        "--health",
        "off",
        "--quic-server-id-len",
        "2",
    ])?;
    for k in 0..BACKENDS {
        let ip = backend_ip(k);
        tb.cli(&[
            "backend",
            "add",
            &nv,
            &SocketAddr::new(ip, NGTCP2_PORT).to_string(),
        ])?;
        tb.cli(&[
            "backend",
            "add",
            &qv,
            &SocketAddr::new(ip, QUINN_PORT).to_string(),
        ])?;
    }

    // 1. ngtcp2: HTTP/3 downloads, each a new connection placed by the
    // choice rule and pinned by its 5-tuple.
    let mut by = std::collections::BTreeMap::new();
    let mut good = 0;
    for i in 0..DOWNLOADS {
        let dl = dir.join(format!("dl-{i}"));
        std::fs::create_dir_all(&dl)?;
        let out = client(
            tb,
            Duration::from_secs(15),
            "gtlsclient",
            &[
                "--quiet",
                "--exit-on-all-streams-close",
                "--download",
                &dl.to_string_lossy(),
                &NGTCP2_VIP.ip().to_string(),
                &NGTCP2_VIP.port().to_string(),
                &format!("https://{NGTCP2_VIP}/blob"),
                &format!("https://{NGTCP2_VIP}/id"),
            ],
        )?;
        let got = std::fs::read(dl.join("blob")).unwrap_or_default();
        let id = std::fs::read_to_string(dl.join("id")).unwrap_or_default();
        if got == blob && id.starts_with("backend ") {
            good += 1;
            *by.entry(id).or_insert(0) += 1;
        } else {
            println!(
                "quic: ngtcp2 download {i}: {} bytes, id {id:?}, client {}",
                got.len(),
                out.status
            );
        }
    }
    println!(
        "quic: ngtcp2: {good} of {DOWNLOADS} HTTP/3 downloads complete, byte for byte; by backend {:?}",
        by.values().collect::<Vec<_>>()
    );
    if good != DOWNLOADS {
        bail!(
            "{} of {DOWNLOADS} ngtcp2 downloads failed",
            DOWNLOADS - good
        );
    }

    // 2. quinn with QUIC-LB connection IDs.
    let before = tb.stats()?.counter("quic_cid_routed");
    let mut removed = 0;
    let seen = run_probe(&tb.client, QUINN_VIP, PROBED, dir, || {
        removed = crate::chance::flush_flows(tb)?;
        println!("quic: balancer flow tables emptied ({removed} entries)");
        Ok(())
    })?;
    let routed = tb.stats()?.counter("quic_cid_routed") - before;
    let k = kept(&seen);
    println!(
        "quic: quinn: {k} of {PROBED} connections kept their backend across a source-port \
         change and an emptied flow table ({removed} entries removed; quic_cid_routed {routed})"
    );
    if k != PROBED || routed == 0 {
        bail!("QUIC-LB routing kept {k} of {PROBED} connections (quic_cid_routed {routed})");
    }

    // 3. Control: the same without QUIC-LB on the VIP.
    tb.cli(&["vip", "set", &qv, "--quic-server-id-len", "0"])?;
    let seen = run_probe(&tb.client, QUINN_VIP, PROBED, dir, || {
        crate::chance::flush_flows(tb).map(|_| ())
    })?;
    let k0 = kept(&seen);
    println!(
        "quic: control: without QUIC-LB, {k0} of {PROBED} connections kept their backend \
         (each new 5-tuple placed by the choice rule)"
    );
    if k0 == PROBED {
        bail!("control: without QUIC-LB every connection kept its backend: the test cannot fail");
    }
    Ok(())
}
