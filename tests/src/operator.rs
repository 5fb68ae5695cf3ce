//! The operator's interface on the test bed (`balancer-testbed operator`):
//! the control API with curl over the unix socket (resources, errors, the
//! OpenAPI description, the read-only socket as an unprivileged user),
//! Prometheus metrics scraped and checked against real traffic, `balancer
//! top` under tmux, the declarative configuration (export, apply, dry run,
//! broken files, a change refused half-way, `run --config`), readiness
//! notification, the systemd unit, logs, and a flow table filled past its
//! warning mark.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use balancer::model::config;
use serde_json::Value;

use crate::{
    scenario::run_batch,
    testbed::{backend_addr, Testbed, VIP},
};

/// Backends of the test bed.
const BACKENDS: usize = 4;
/// The metrics address, inside the balancer's namespace.
const METRICS: &str = "127.0.0.1:9464";

/// Runs the scenario.
///
/// # Errors
/// Any check that fails.
pub fn run() -> anyhow::Result<()> {
    let mut tb = Testbed::build(BACKENDS)?;
    let ro = tb.dir().join("ro.sock");
    tb.daemon_args = vec![
        "--metrics-address".into(),
        METRICS.into(),
        "--read-only-socket".into(),
        ro.display().to_string(),
        "--read-only-group".into(),
        "nogroup".into(),
    ];
    tb.start_daemon()?;
    let r = run_on(&mut tb, &ro);
    if r.is_err() {
        eprintln!("--- daemon log ---\n{}", tb.daemon_log());
    }
    r
}

fn run_on(tb: &mut Testbed, ro: &Path) -> anyhow::Result<()> {
    api(tb)?;
    hang_ups(tb)?;
    read_only(tb, ro)?;
    metrics_and_top(tb)?;
    declarative(tb)?;
    readiness_and_unit(tb)?;
    logs(tb)?;
    table_filling(tb)?;
    Ok(())
}

/// One request with curl over a unix socket: (status, JSON body).
fn curl_as(
    user: Option<&str>,
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    let mut cmd = match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={u}"),
                "--regid=nogroup",
                "--clear-groups",
                "curl",
            ]);
            c
        }
        None => Command::new("curl"),
    };
    cmd.args(["-sS", "--max-time", "20", "--unix-socket"])
        .arg(socket)
        .args(["-X", method, "-w", "\n%{http_code}"]);
    if let Some(b) = body {
        cmd.args(["-H", "content-type: application/json", "--data-binary", b]);
    }
    cmd.arg(format!("http://localhost{path}"));
    let out = cmd.output().context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').with_context(|| {
        format!(
            "curl {method} {path}: {text:?} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let code: u16 = code.trim().parse().with_context(|| {
        format!(
            "curl {method} {path}: no status in {text:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let json = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).with_context(|| format!("curl {method} {path}: {body}"))?
    };
    Ok((code, json))
}

fn curl(
    tb: &Testbed,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> anyhow::Result<(u16, Value)> {
    curl_as(None, tb.socket(), method, path, body)
}

fn expect(
    tb: &Testbed,
    method: &str,
    path: &str,
    body: Option<&str>,
    status: u16,
) -> anyhow::Result<Value> {
    let (code, v) = curl(tb, method, path, body)?;
    ensure!(
        code == status,
        "{method} {path}: HTTP {code} (expected {status}): {v}"
    );
    if status >= 400 {
        ensure!(
            v["result"] == "error" && v["status"] == status && v["message"].is_string(),
            "{method} {path}: the error body is not an error object: {v}"
        );
    }
    Ok(v)
}

/// The resources with curl: VIPs and backends created, changed, listed and
/// removed; every kind of mistake answered with its status; the OpenAPI
/// description well formed and covering every route.
fn api(tb: &mut Testbed) -> anyhow::Result<()> {
    api_resources(tb)?;
    api_mistakes(tb)?;
    api_reads(tb)?;
    api_description(tb)
}

/// The second VIP of [`api`], for the changes and the mistakes.
const OTHER: &str = "10.0.0.10:81";

/// The VIP with its backends, a second VIP whose backends are weighted,
/// changed and drained; both read back.
fn api_resources(tb: &Testbed) -> anyhow::Result<()> {
    let vip = VIP.to_string();
    // Settings not given take their defaults.
    expect(
        tb,
        "POST",
        "/v1/vips",
        Some(&format!(r#"{{"vip":"{vip}","settings":{{"choices":2}}}}"#)),
        200,
    )?;
    let backends: Vec<String> = (0..BACKENDS).map(|k| backend_addr(k).to_string()).collect();
    expect(
        tb,
        "POST",
        &format!("/v1/vips/{vip}/backends"),
        Some(&serde_json::json!({ "backends": backends }).to_string()),
        200,
    )?;
    let v = expect(tb, "GET", &format!("/v1/vips/{vip}"), None, 200)?;
    ensure!(
        v["result"] == "vips"
            && v["vips"][0]["backends"] == BACKENDS
            && v["vips"][0]["settings"]["choices"] == 2
            && v["vips"][0]["settings"]["eject_after"] == 3,
        "GET /v1/vips/{vip}: {v}"
    );
    // A second VIP for the changes: choices "all" reads back as "all".
    let other = OTHER;
    // (method, path, body): each answered 200.
    let changes: [(&str, String, Option<String>); 4] = [
        (
            "POST",
            "/v1/vips".into(),
            Some(format!(
                r#"{{"vip":"{other}","settings":{{"choices":"all"}}}}"#
            )),
        ),
        (
            "POST",
            format!("/v1/vips/{other}/backends"),
            Some(r#"{"backends":["10.0.2.10:81","10.0.2.11:81"],"weight":2}"#.into()),
        ),
        (
            "PATCH",
            format!("/v1/vips/{other}/backends/10.0.2.10:81"),
            Some(r#"{"weight":5}"#.into()),
        ),
        (
            "POST",
            format!("/v1/vips/{other}/backends/10.0.2.11:81/drain"),
            None,
        ),
    ];
    for (method, path, body) in &changes {
        expect(tb, method, path, body.as_deref(), 200)?;
    }
    let v = expect(tb, "GET", &format!("/v1/vips/{other}/backends"), None, 200)?;
    let list = v["backends"].as_array().context("backends")?;
    ensure!(
        list.len() == 2
            && list[0]["weight"] == 5
            && list[1]["state"] == "draining"
            && list[1]["weight"] == 2,
        "backends of {other}: {v}"
    );
    let v = expect(tb, "GET", "/v1/vips", None, 200)?;
    let all = v["vips"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["vip"] == other))
        .context("the second VIP listed")?;
    ensure!(
        all["settings"]["choices"] == "all",
        "choices of {other}: {all}"
    );
    Ok(())
}

/// Mistakes, a table of (method, path, body, status): each answered with
/// its status and an error object, nothing changed. `{other}` in a path or
/// a body is [`OTHER`].
const MISTAKES: &[(&str, &str, Option<&str>, u16)] = &[
    ("GET", "/v1/vips/10.0.0.99:80", None, 404),
    ("GET", "/v1/vips/not-an-address", None, 400),
    ("POST", "/v1/vips", Some("{\"vip\":"), 400),
    ("POST", "/v1/vips", Some(r#"{"vip":"{other}"}"#), 409),
    ("PATCH", "/v1/vips/{other}", Some(r#"{"choices":17}"#), 400),
    (
        "POST",
        "/v1/vips/{other}/backends",
        Some(r#"{"backends":["10.0.2.12:81"],"weight":0}"#),
        400,
    ),
    (
        "DELETE",
        "/v1/vips/{other}/backends/10.0.2.99:81",
        None,
        404,
    ),
    ("GET", "/v2/vips", None, 404),
    // Unknown fields, at any depth, and an empty list are refused.
    (
        "POST",
        "/v1/vips/{other}/backends",
        Some(r#"{"backends":[]}"#),
        400,
    ),
    (
        "POST",
        "/v1/vips/{other}/backends",
        Some(r#"{"backends":["10.0.2.12:81"],"wieght":2}"#),
        400,
    ),
    (
        "PATCH",
        "/v1/vips/{other}",
        Some(r#"{"choices":2,"health":{"check":{"intervall":"1s"}}}"#),
        400,
    ),
    (
        "POST",
        "/v1/vips",
        Some(r#"{"vip":"10.0.0.10:82","settings":{"chioces":2}}"#),
        400,
    ),
    ("GET", "/v1/vips/10.0.0.10:82", None, 404),
    // The router's own refusals are error objects too: a method a path
    // does not serve, a query that does not parse (a body too large:
    // below).
    ("DELETE", "/v1/stats", None, 405),
    ("GET", "/v1/flows?limit=many", None, 400),
];

/// The rows of [`MISTAKES`], then a body too large; the second VIP's
/// backends unchanged; then the VIP removed.
fn api_mistakes(tb: &Testbed) -> anyhow::Result<()> {
    let other = OTHER;
    for (method, path, body, status) in MISTAKES {
        let path = path.replace("{other}", other);
        let body = body.map(|b| b.replace("{other}", other));
        expect(tb, method, &path, body.as_deref(), *status)?;
    }
    refusals_as_data(tb, other)?;
    let big = format!(r#"{{"backends":["{}"]}}"#, "x".repeat(2 << 20));
    let bigf = tb.dir().join("big.json");
    std::fs::write(&bigf, &big)?;
    expect(
        tb,
        "POST",
        &format!("/v1/vips/{other}/backends"),
        Some(&format!("@{}", bigf.display())),
        413,
    )?;
    let v = expect(tb, "GET", &format!("/v1/vips/{other}/backends"), None, 200)?;
    ensure!(
        v["backends"].as_array().map(Vec::len) == Some(2),
        "a refused request changed the backends: {v}"
    );
    // An IPv6 address in a path: brackets percent-encoded.
    expect(tb, "GET", "/v1/vips/%5B2001:db8::10%5D:80", None, 404)?;
    expect(tb, "DELETE", &format!("/v1/vips/{other}"), None, 200)?;
    expect(tb, "GET", &format!("/v1/vips/{other}"), None, 404)?;
    Ok(())
}

/// Two of the refused values again: their VIP, field and reason as keys of
/// the error object's own, besides its message.
fn refusals_as_data(tb: &Testbed, other: &str) -> anyhow::Result<()> {
    let v = expect(
        tb,
        "PATCH",
        &format!("/v1/vips/{other}"),
        Some(r#"{"choices":17}"#),
        400,
    )?;
    ensure!(
        v["vip"] == other
            && v["field"] == "choices"
            && v["reason"]
                == serde_json::json!({"kind": "out_of_range", "got": "17", "min": "1", "max": "16"})
            && v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&format!("VIP {other}: choices: 17 is outside"))),
        "choices 17: {v}"
    );
    let v = expect(
        tb,
        "POST",
        &format!("/v1/vips/{other}/backends"),
        Some(r#"{"backends":["10.0.2.12:81"],"weight":0}"#),
        400,
    )?;
    ensure!(
        v["vip"] == other
            && v["field"] == "weight"
            && v["reason"]["kind"] == "out_of_range"
            && v["reason"]["got"] == "0",
        "weight 0: {v}"
    );
    Ok(())
}

/// Stats, health, flows and the version, read.
fn api_reads(tb: &Testbed) -> anyhow::Result<()> {
    // Stats: counters by name (`.counters.new_flows` is a number).
    let v = expect(tb, "GET", "/v1/stats", None, 200)?;
    ensure!(
        v["counters"]["new_flows"].is_u64() && v["counters"]["rx_packets"].is_u64(),
        "stats counters are not an object of numbers: {}",
        v["counters"]
    );
    let v = expect(tb, "GET", "/v1/health", None, 200)?;
    ensure!(
        v["backends"].as_array().map(Vec::len) == Some(BACKENDS),
        "health: {v}"
    );
    let v = expect(tb, "GET", "/v1/flows?limit=5", None, 200)?;
    ensure!(v["flows"].is_array(), "flows: {v}");
    let v = expect(tb, "GET", "/v1/version", None, 200)?;
    let cli_version = tb.cli(&["--version"])?;
    ensure!(
        v["commit"]
            .as_str()
            .is_some_and(|c| cli_version.contains(c))
            && v["fingerprint"]
                .as_str()
                .is_some_and(|f| cli_version.contains(f)),
        "the daemon's version {v} is not the CLI's {cli_version}"
    );
    Ok(())
}

/// The description: parsed as OpenAPI 3.1, every route in it.
fn api_description(tb: &Testbed) -> anyhow::Result<()> {
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket"])
        .arg(tb.socket())
        .arg("http://localhost/v1/openapi.json")
        .output()?;
    let spec: oas3::OpenApiV3Spec = serde_json::from_slice(&out.stdout)
        .context("/v1/openapi.json is not an OpenAPI 3.1 document")?;
    let paths = spec.paths.clone().unwrap_or_default();
    for p in [
        "/v1/vips",
        "/v1/vips/{vip}",
        "/v1/vips/{vip}/backends",
        "/v1/vips/{vip}/backends/{backend}",
        "/v1/vips/{vip}/backends/{backend}/drain",
        "/v1/vips/{vip}/backends/{backend}/undrain",
        "/v1/backends",
        "/v1/health",
        "/v1/stats",
        "/v1/flows",
        "/v1/version",
        "/v1/config",
        "/v1/detach",
    ] {
        ensure!(paths.contains_key(p), "the OpenAPI description lacks {p}");
    }
    println!(
        "operator: API with curl over the unix socket: VIPs and backends added, changed, drained, \
         listed and removed; 404, 400, 409, 400, unknown fields, an empty list, 405, a bad query and \
         413 answered as error objects with nothing changed; \
         OpenAPI {} with {} paths",
        spec.openapi,
        paths.len()
    );
    Ok(())
}

/// Clients that send a request and close before reading the answer (a
/// CLI interrupted, a `--timeout` that expired): the daemon's write meets a
/// closed socket (EPIPE), and it must go on serving.
fn hang_ups(tb: &Testbed) -> anyhow::Result<()> {
    use std::io::Write;
    let pid = tb.daemon_pid().context("daemon pid")?;
    for i in 0..100 {
        let mut s = std::os::unix::net::UnixStream::connect(tb.socket())?;
        // Past its deadline (answered at once, 408) or a large answer.
        let (path, deadline) = match i % 3 {
            0 => ("/v1/vips", "x-deadline-unix-ms: 1\r\n"),
            1 => ("/v1/flows?limit=10000", ""),
            _ => ("/v1/stats", "x-deadline-unix-ms: 1\r\n"),
        };
        // The daemon may close first (at its connection cap it refuses at
        // once): a write that meets the closed socket is this client's
        // hang-up too, not the test's failure.
        let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n{deadline}\r\n").as_bytes());
        drop(s);
    }
    thread_sleep_ms(300);
    ensure!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "the daemon died of clients that hung up before their answer"
    );
    tb.cli(&["vip", "list"])
        .context("the daemon after 100 clients hung up")?;
    println!("operator: 100 clients that hung up before their answer left the daemon serving");
    Ok(())
}

fn thread_sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// The read-only socket, as `nobody` in group `nogroup`: reads work,
/// changes are refused with 405; the root socket refuses the same user.
fn read_only(tb: &Testbed, ro: &Path) -> anyhow::Result<()> {
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(ro)?.permissions());
    ensure!(mode & 0o777 == 0o660, "read-only socket mode {mode:o}");
    let (code, v) = curl_as(Some("nobody"), ro, "GET", "/v1/vips", None)?;
    ensure!(
        code == 200 && v["result"] == "vips",
        "GET on the read-only socket: {code} {v}"
    );
    let (code, v) = curl_as(Some("nobody"), ro, "GET", "/v1/stats", None)?;
    ensure!(code == 200, "stats on the read-only socket: {code} {v}");
    let (code, v) = curl_as(
        Some("nobody"),
        ro,
        "POST",
        "/v1/vips",
        Some(r#"{"vip":"10.0.0.10:82"}"#),
    )?;
    ensure!(
        code == 405 && v["status"] == 405,
        "POST on the read-only socket: {code} {v}"
    );
    let (code, _) = curl_as(None, ro, "DELETE", &format!("/v1/vips/{VIP}"), None)?;
    ensure!(
        code == 405,
        "DELETE on the read-only socket as root: {code}"
    );
    ensure!(
        !tb.cli(&["vip", "list"])?.contains("10.0.0.10:82"),
        "a POST on the read-only socket changed something"
    );
    // The root socket: mode 0600, so the user cannot even connect.
    let r = curl_as(Some("nobody"), tb.socket(), "GET", "/v1/vips", None);
    ensure!(
        !matches!(r, Ok((200, _))),
        "the root-only socket served nobody: {r:?}"
    );
    // The CLI on the read-only socket: reads only.
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(tb.balancer_bin())
        .arg("--socket")
        .arg(ro)
        .args(["backend", "list"])
        .output()?;
    ensure!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains(&backend_addr(0).to_string()),
        "`backend list` on the read-only socket as nobody: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(tb.balancer_bin())
        .arg("--socket")
        .arg(ro)
        .args([
            "backend",
            "drain",
            &VIP.to_string(),
            &backend_addr(0).to_string(),
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("read-only"),
        "`backend drain` on the read-only socket: {err}"
    );
    println!(
        "operator: the read-only socket (0660, group nogroup) served GETs to nobody and refused \
         its POST and the CLI's drain with 405; the root socket refused nobody"
    );
    Ok(())
}

/// The text exposition: `name{labels}` to value.
fn scrape(tb: &Testbed) -> anyhow::Result<BTreeMap<String, f64>> {
    let out = tb.lb.exec(
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            &format!("http://{METRICS}/metrics"),
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.trim_end().ends_with("# EOF"),
        "a scrape without its end: {text}"
    );
    let mut m = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = l.rsplit_once(' ').with_context(|| format!("line {l:?}"))?;
        let v: f64 = value.parse().with_context(|| format!("line {l:?}"))?;
        m.insert(name.to_string(), v);
    }
    Ok(m)
}

fn metric(m: &BTreeMap<String, f64>, key: &str) -> anyhow::Result<f64> {
    m.get(key)
        .copied()
        .with_context(|| format!("no {key} in the scrape"))
}

fn bl(b: SocketAddr) -> String {
    format!("vip=\"{VIP}\",backend=\"{b}\"")
}

/// Real traffic, then the scrape: new connections per backend as the
/// clients saw them, active connections as held, packets and bytes as the
/// API reports, health transitions of a failing check; the live view under
/// tmux with the same active counts.
fn metrics_and_top(tb: &Testbed) -> anyhow::Result<()> {
    let before = scrape(tb)?;
    let vip_new = format!("p2c_balancer_vip_connections_total{{vip=\"{VIP}\"}}");
    let v0 = metric(&before, &vip_new)?;
    let batch = run_batch(tb, 200, 40, 4, 7_000_000)?;
    // FINs of the closed connections are counted as they arrive.
    std::thread::sleep(Duration::from_millis(500));
    let m = scrape(tb)?;
    let stats = tb.stats()?;
    ensure!(
        metric(&m, &vip_new)? - v0 == 200.0,
        "vip_connections_total grew by {} for 200 connections",
        metric(&m, &vip_new)? - v0
    );
    let mut active = 0.0;
    for k in 0..BACKENDS {
        let b = backend_addr(k);
        let placed = batch.per_backend.get(&b).copied().unwrap_or(0) as f64;
        let new = metric(
            &m,
            &format!("p2c_balancer_backend_connections_total{{{}}}", bl(b)),
        )? - before
            .get(&format!(
                "p2c_balancer_backend_connections_total{{{}}}",
                bl(b)
            ))
            .copied()
            .unwrap_or(0.0);
        ensure!(
            new == placed,
            "backend {b}: metrics count {new} new connections, the clients saw {placed}"
        );
        active += metric(
            &m,
            &format!("p2c_balancer_backend_active_connections{{{}}}", bl(b)),
        )?;
        let view = stats
            .backends
            .iter()
            .find(|x| x.backend == b)
            .context("backend")?;
        for (name, want) in [
            ("backend_packets_total", view.packets),
            ("backend_bytes_total", view.bytes),
        ] {
            let got = metric(&m, &format!("p2c_balancer_{name}{{{}}}", bl(b)))?;
            ensure!(
                got == want as f64,
                "{name} of {b}: scraped {got}, the API says {want}"
            );
        }
        ensure!(
            metric(
                &m,
                &format!(
                    "p2c_balancer_backend_health{{{},status=\"unchecked\"}}",
                    bl(b)
                )
            )? == 1.0,
            "backend {b} is not `unchecked` in the scrape"
        );
    }
    ensure!(
        active == 40.0,
        "active connections in the scrape: {active}, 40 held"
    );
    ensure!(
        metric(
            &m,
            &format!("p2c_balancer_vip_active_connections{{vip=\"{VIP}\"}}")
        )? == 40.0,
        "vip_active_connections"
    );
    ensure!(
        metric(
            &m,
            &format!("p2c_balancer_vip_choice_decisions_total{{vip=\"{VIP}\"}}")
        )? >= 200.0,
        "choice decisions"
    );
    ensure!(
        metric(
            &m,
            "p2c_balancer_dropped_packets_total{reason=\"no_backend\"}"
        )? == 0.0,
        "drops by reason"
    );
    ensure!(
        metric(&m, "p2c_balancer_gc_pass_duration_seconds_count")? > 0.0,
        "no expiry pass timed"
    );
    ensure!(
        metric(&m, "p2c_balancer_flow_table_size")?
            == f64::from(balancer_common::DEFAULT_FLOW_TABLE_SIZE),
        "flow_table_size"
    );
    ensure!(
        metric(&m, "p2c_balancer_new_flows_total")? == stats.counter("new_flows") as f64,
        "new_flows_total"
    );
    println!(
        "operator: metrics scraped after 200 connections (40 held): new connections per backend \
         {:?} as the clients saw them, 40 active, packets and bytes equal to the API's",
        batch.per_backend.values().collect::<Vec<_>>()
    );

    top(tb, &stats)?;

    // A failing check of one backend: the transition shows in the scrape.
    let b3 = backend_addr(3).to_string();
    tb.cli(&[
        "backend",
        "set",
        &VIP.to_string(),
        &b3,
        "--health",
        "tcp",
        "--health-port",
        "1",
        "--health-interval",
        "200ms",
        "--health-timeout",
        "100ms",
        "--health-fall",
        "1",
    ])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let key = format!(
        "p2c_balancer_backend_health{{{},status=\"unhealthy\"}}",
        bl(backend_addr(3))
    );
    loop {
        let m = scrape(tb)?;
        if m.get(&key) == Some(&1.0) {
            let t = metric(
                &m,
                &format!(
                    "p2c_balancer_backend_health_transitions_total{{{}}}",
                    bl(backend_addr(3))
                ),
            )?;
            ensure!(t >= 1.0, "health transitions {t}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "backend 3 never unhealthy in the scrape"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    tb.cli(&["backend", "set", &VIP.to_string(), &b3, "--health", "vip"])?;
    for c in batch.held {
        c.close();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = scrape(tb)?;
        if metric(
            &m,
            &format!("p2c_balancer_vip_active_connections{{vip=\"{VIP}\"}}"),
        )? == 0.0
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "active connections never back to 0 in the scrape"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("operator: a failing check showed as unhealthy with its transition; closed connections left 0 active");
    Ok(())
}

/// `balancer top` under tmux: the table with every backend and its active
/// connections as the API counts them; `q` ends it. Mistakes end it
/// before it takes the screen.
fn top(tb: &Testbed, stats: &balancer::model::api::StatsView) -> anyhow::Result<()> {
    let server = format!("p2c-top-{}", std::process::id());
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(["-L", &server])
            .args(args)
            .output()
    };
    let cmd = format!(
        "{} --socket {} top --interval 300ms",
        tb.balancer_bin().display(),
        tb.socket().display()
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        &cmd,
    ])?;
    ensure!(
        started.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let r = (|| -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            std::thread::sleep(Duration::from_millis(700));
            let screen =
                String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "top"])?.stdout)
                    .into_owned();
            let rows_ok = (0..BACKENDS).all(|k| screen.contains(&backend_addr(k).to_string()));
            // The second frame has rates.
            if screen.contains("BACKEND")
                && screen.contains("gap")
                && rows_ok
                && screen.contains("NEW/S")
            {
                return Ok(screen);
            }
            if Instant::now() > deadline {
                bail!("the live view never showed the table:\n{screen}");
            }
        }
    })();
    let screen = match r {
        Ok(s) => s,
        Err(e) => {
            let _ = tmux(&["kill-server"]);
            return Err(e);
        }
    };
    // Each backend's row: its ACTIVE column is the API's count.
    for b in &stats.backends {
        let row = screen
            .lines()
            .find(|l| {
                l.contains(&format!(" {} ", b.backend)) || l.contains(&format!("{} ", b.backend))
            })
            .with_context(|| format!("no row of {} in\n{screen}", b.backend))?;
        let words: Vec<&str> = row
            .split(|c: char| c.is_whitespace() || c == '│')
            .filter(|w| !w.is_empty())
            .collect();
        let i = words
            .iter()
            .position(|w| *w == b.backend.to_string())
            .context("backend column")?;
        // BACKEND STATE HEALTH WEIGHT ACTIVE
        let shown: u64 = words
            .get(i + 4)
            .and_then(|w| w.parse().ok())
            .with_context(|| format!("no ACTIVE column in the row {row:?}"))?;
        ensure!(
            shown == b.active_connections,
            "top shows {shown} active for {}, the API {}",
            b.backend,
            b.active_connections
        );
    }
    tmux(&["send-keys", "-t", "top", "q"])?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while tmux(&["has-session", "-t", "top"])?.status.success() {
        if Instant::now() > deadline {
            let _ = tmux(&["kill-server"]);
            bail!("`q` did not end the live view");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = tmux(&["kill-server"]);
    let header = screen
        .lines()
        .find(|l| l.contains("busiest"))
        .unwrap_or_default()
        .trim_matches(|c: char| c == '│' || c.is_whitespace())
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    // Mistakes are reported before the screen is taken.
    let e = tb
        .cli(&["top", "--vip", "10.0.0.99:80", "--iterations", "1"])
        .unwrap_err()
        .to_string();
    ensure!(
        e.contains("no VIP 10.0.0.99:80"),
        "top of a missing VIP: {e}"
    );
    let e = tb
        .cli_on(&tb.dir().join("nothing.sock"), &["top"])
        .unwrap_err()
        .to_string();
    ensure!(e.contains("not running"), "top without a daemon: {e}");
    let e = tb.cli(&["top"]).unwrap_err().to_string();
    ensure!(
        e.contains("draws on a terminal"),
        "top without a terminal: {e}"
    );
    println!(
        "operator: `balancer top` under tmux showed every backend with the API's active counts \
         ({header}), and `q` ended it; a missing VIP, a missing daemon and a missing terminal were \
         reported before the screen was taken"
    );
    Ok(())
}

fn export(tb: &Testbed) -> anyhow::Result<String> {
    tb.cli(&["export"])
}

fn write(tb: &Testbed, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let p = tb.dir().join(name);
    std::fs::write(&p, text)?;
    Ok(p)
}

/// The declarative configuration: a round trip identical, a dry run that
/// changes nothing, changes applied as shown, broken files and a change
/// refused half-way leaving everything as it was.
fn declarative(tb: &mut Testbed) -> anyhow::Result<()> {
    let base = export(tb)?;
    let f1 = write(tb, "base.toml", &base)?;
    let f1s = f1.display().to_string();
    let out = tb.cli(&["apply", "-f", &f1s])?;
    ensure!(
        out.contains("nothing to change"),
        "apply of the export: {out}"
    );
    ensure!(export(tb)? == base, "a round trip changed the export");

    // Changes: a weight, a drain, a new VIP with backends, a timeout.
    let mut c = config::parse(&base)?;
    let vip = c
        .vips
        .iter_mut()
        .find(|v| v.address == VIP)
        .context("VIP")?;
    vip.backends[0].weight = 3;
    vip.backends[3].drained = true;
    let mut other = vip.clone();
    other.address = "10.0.0.10:81".parse()?;
    other.backends.truncate(2);
    for b in &mut other.backends {
        b.address.set_port(81);
        b.weight = 1;
        b.drained = false;
    }
    c.vips.push(other);
    let mut t = c.timeouts.context("timeouts exported")?;
    t.established = Duration::from_secs(600);
    c.timeouts = Some(t);
    let changed = config::to_toml(&c)?;
    let f3 = write(tb, "changed.toml", &changed)?;
    let f3s = f3.display().to_string();
    let dry = tb.cli(&["apply", "-f", &f3s, "--dry-run"])?;
    for line in [
        "~ timeouts",
        &format!("~ backend {} of {VIP} weight 3", backend_addr(0)),
        &format!("~ backend {} of {VIP} drained", backend_addr(3)),
        "+ vip 10.0.0.10:81",
        "+ backend 10.0.2.10:81 of 10.0.0.10:81 weight 1",
        "dry run: nothing applied",
    ] {
        ensure!(dry.contains(line), "the dry run lacks {line:?}:\n{dry}");
    }
    ensure!(export(tb)? == base, "a dry run changed the running state");
    let done = tb.cli(&["apply", "-f", &f3s])?;
    ensure!(done.contains("applied 6 changes"), "apply: {done}");
    let now = export(tb)?;
    ensure!(
        now == changed,
        "after apply the export is not the file:\n{now}\n---\n{changed}"
    );

    // A broken file: its line named, nothing changed.
    let mut lines: Vec<&str> = changed.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("weight"))
        .context("a weight line")?;
    lines.insert(at + 1, "wieght = 2");
    let bad = write(tb, "typo.toml", &lines.join("\n"))?;
    let e = tb
        .cli(&["apply", "-f", &bad.display().to_string()])
        .unwrap_err()
        .to_string();
    ensure!(
        e.contains(&format!("typo.toml:{}:1: unknown field `wieght`", at + 2)),
        "a typo at line {}: {e}",
        at + 2
    );
    let bad = write(
        tb,
        "syntax.toml",
        "[[vip]]\naddress = \"10.0.0.10:80\nchoices = 2\n",
    )?;
    let e = tb
        .cli(&["apply", "-f", &bad.display().to_string()])
        .unwrap_err()
        .to_string();
    ensure!(
        e.contains("syntax.toml:2:"),
        "an unclosed string at line 2: {e}"
    );
    // A change refused half-way (a VIP that comes first, then a mode change
    // of a VIP with backends): all of it rolled back.
    let mut c2 = config::parse(&changed)?;
    let mut first = c2.vips[0].clone();
    first.address = "10.0.0.9:80".parse()?;
    first.backends.clear();
    c2.vips.push(first);
    c2.vips
        .iter_mut()
        .find(|v| v.address == VIP)
        .context("VIP")?
        .mode = balancer::model::state::ForwardingMode::Dsr;
    let half = write(tb, "half.toml", &config::to_toml(&c2)?)?;
    let e = tb
        .cli(&["apply", "-f", &half.display().to_string()])
        .unwrap_err()
        .to_string();
    ensure!(e.contains("nothing was applied"), "a refused apply: {e}");
    ensure!(
        export(tb)? == changed,
        "a refused apply left something changed:\n{}",
        export(tb)?
    );
    // A refusal after a removal: the removal (of the backend a held
    // connection uses) is not made either, so the connection lives on.
    let ns = tb.client_ns_path();
    let mut held = std::thread::spawn(move || -> anyhow::Result<crate::testbed::Conn> {
        crate::netns::enter_ns(&ns)?;
        crate::testbed::Conn::open(7_000, 256)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    let mut c4 = config::parse(&changed)?;
    let v80 = c4
        .vips
        .iter_mut()
        .find(|v| v.address == VIP)
        .context("VIP")?;
    v80.backends.retain(|b| b.address != held.backend);
    c4.vips
        .iter_mut()
        .find(|v| v.address.port() == 81)
        .context("VIP :81")?
        .mode = balancer::model::state::ForwardingMode::Dsr;
    let cut = write(tb, "cut.toml", &config::to_toml(&c4)?)?;
    let dry = tb
        .cli(&["apply", "-f", &cut.display().to_string(), "--dry-run"])
        .unwrap_err()
        .to_string();
    let e = tb
        .cli(&["apply", "-f", &cut.display().to_string()])
        .unwrap_err()
        .to_string();
    ensure!(
        dry.contains("mode") && e.contains("change 2 of") && e.contains("nothing was applied"),
        "a removal then a refused mode change: dry run {dry:?}, apply {e:?}"
    );
    ensure!(
        export(tb)? == changed,
        "the refused apply changed something"
    );
    let again = held
        .request(7_001, 256)
        .context("the held connection after a refused apply that would have removed its backend")?;
    ensure!(
        again == held.backend,
        "the held connection moved to {again}"
    );
    held.close();
    // A body with a misspelt field is refused whole (`dryrun` for
    // `dry_run` must not apply an empty configuration).
    let v = expect(
        tb,
        "PUT",
        "/v1/config",
        Some(r#"{"config":{},"dryrun":true}"#),
        400,
    )?;
    ensure!(
        v["message"].as_str().is_some_and(|m| m.contains("dryrun")),
        "a misspelt dry_run: {v}"
    );
    ensure!(
        export(tb)? == changed,
        "a misspelt dry_run changed something"
    );
    // An empty file (or one without VIPs) removes nothing unless meant.
    let empty = write(tb, "empty.toml", "")?;
    let es = empty.display().to_string();
    let e = tb.cli(&["apply", "-f", &es]).unwrap_err().to_string();
    ensure!(e.contains("--allow-empty"), "an empty file: {e}");
    let e = tb
        .cli(&["apply", "-f", &es, "--dry-run"])
        .unwrap_err()
        .to_string();
    ensure!(e.contains("--allow-empty"), "an empty file, dry run: {e}");
    ensure!(export(tb)? == changed, "an empty file changed something");
    // A value error names its VIP, its backend, its key and its line:
    // the line of the backend's `weight`.
    let mut c5 = config::parse(&changed)?;
    let (v1, b1) = (c5.vips[0].address, c5.vips[0].backends[1].address);
    c5.vips[0].backends[1].weight = 5000;
    let text5 = config::to_toml(&c5)?;
    let at_b1 = text5
        .lines()
        .position(|l| l.contains(&format!("\"{b1}\"")))
        .context("backend line")?;
    let line5 = text5
        .lines()
        .skip(at_b1)
        .position(|l| l.starts_with("weight = 5000"))
        .context("weight line")?
        + at_b1
        + 1;
    let w = write(tb, "weight.toml", &text5)?;
    let e = tb
        .cli(&["apply", "-f", &w.display().to_string()])
        .unwrap_err()
        .to_string();
    ensure!(
        e.contains(&format!(
            "weight.toml:{line5}:1: VIP {v1} backend {b1}: weight: 5000 is outside 1..=1000"
        )),
        "weight 5000 at line {line5}: {e}"
    );
    // An invalid value is refused before anything is tried.
    let mut c3 = config::parse(&changed)?;
    c3.vips[0].backends[0].weight = 0;
    let zero = write(tb, "zero.toml", &config::to_toml(&c3)?)?;
    let e = tb
        .cli(&["apply", "-f", &zero.display().to_string(), "--dry-run"])
        .unwrap_err()
        .to_string();
    ensure!(e.contains("weight"), "weight 0: {e}");
    ensure!(export(tb)? == changed, "weight 0 changed something");

    // `run --config` with a file never applied before: the start makes the
    // running state the file (a file applied before and unchanged since
    // would change nothing: `balancer-testbed truth`).
    tb.stop_daemon();
    let start = write(tb, "start.toml", &base)?;
    tb.daemon_args
        .extend(["--config".to_string(), start.display().to_string()]);
    tb.start_daemon()?;
    let after = export(tb)?;
    ensure!(
        after == base,
        "`run --config` did not start from the file:\n{after}\n---\n{base}"
    );
    // A broken file refuses the start, naming its line, and keeps the
    // running daemon's state.
    let (ok, err) = tb.refused_start(&[
        "--socket",
        &tb.dir().join("other.sock").display().to_string(),
        "run",
        "--iface",
        "lb0",
        "--config",
        &bad.display().to_string(),
        "--state-file",
        &tb.dir().join("other-state.json").display().to_string(),
        "--pin-dir",
        &tb.dir().join("bpffs").join("other").display().to_string(),
    ])?;
    ensure!(
        !ok && err.contains("syntax.toml:2:"),
        "a start with a broken file: {ok} {err}"
    );
    println!(
        "operator: export, apply and export again identical; a dry run listed the 6 changes and \
         changed nothing; apply made them; a typo (line {}), a syntax error (line 2), weight 0 and a \
         mode change refused after an added VIP changed nothing; a removal before a refused change \
         was not made (its held connection answered after), a misspelt dry_run was refused, an \
         empty file was refused without --allow-empty, weight 5000 was named with its VIP, \
         backend and line; `run --config` started from the \
         file; a broken file refused the start",
        at + 2
    );
    Ok(())
}

/// Readiness through NOTIFY_SOCKET (READY=1 only once the API answers;
/// STOPPING=1 at stop), the systemd unit checked by systemd-analyze.
fn readiness_and_unit(tb: &mut Testbed) -> anyhow::Result<()> {
    let notify = tb.dir().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&notify)?;
    sock.set_read_timeout(Some(Duration::from_secs(60)))?;
    tb.stop_daemon();
    tb.daemon_env = vec![("NOTIFY_SOCKET".into(), notify.display().to_string())];
    tb.spawn_daemon()?;
    let mut buf = [0u8; 512];
    let n = sock
        .recv(&mut buf)
        .context("no readiness notification within 60 s")?;
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    ensure!(msg.contains("READY=1"), "notification {msg:?}");
    // Ready means serving: the API answers at once.
    let vips = tb.cli(&["vip", "list"]).context("the API after READY=1")?;
    ensure!(
        vips.contains(&VIP.to_string()),
        "vip list after READY=1: {vips}"
    );
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    tb.stop_daemon();
    let n = sock.recv(&mut buf).context("no notification at stop")?;
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    ensure!(msg.contains("STOPPING=1"), "notification at stop {msg:?}");
    tb.daemon_env.clear();
    tb.start_daemon()?;

    // The unit, with ExecStart pointing at this build.
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/p2c-balancer.service"),
    )?;
    let unit = unit.replace(
        "/usr/bin/balancer",
        &tb.balancer_bin().display().to_string(),
    );
    let verify = |text: &str| -> anyhow::Result<(bool, String)> {
        let dir = tb.dir().join("unit");
        std::fs::create_dir_all(&dir)?;
        let p = dir.join("p2c-balancer.service");
        std::fs::write(&p, text)?;
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&p)
            .output()?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success() && said.trim().is_empty(), said))
    };
    let (ok, said) = verify(&unit)?;
    ensure!(ok, "systemd-analyze verify: {said}");
    ensure!(unit.contains("Type=notify"), "the unit is not Type=notify");
    // The check can fail: a misspelt key is reported.
    let (ok, said) = verify(&unit.replace("Type=notify", "Tpye=notify"))?;
    ensure!(!ok, "systemd-analyze verify passed a misspelt key: {said}");
    println!(
        "operator: READY=1 arrived with the API answering, STOPPING=1 at SIGTERM; \
         systemd-analyze verify passed the unit (and caught a misspelt key)"
    );
    Ok(())
}

/// Every change, attach and health transition is in the log; traffic
/// writes nothing.
fn logs(tb: &Testbed) -> anyhow::Result<()> {
    let log = tb.daemon_log();
    for line in [
        "attached to lb0",
        "control: vip add 10.0.0.10:81 (tcp, mode nat, choices all) (by curl[",
        "uid 0)",
        "(by balancer[",
        "control: backend set",
        "control: backend drain 10.0.0.10:81 10.0.2.11:81",
        "control: vip remove 10.0.0.10:81",
        "control: refused: vip add 10.0.0.10:81",
        "control: apply: + vip 10.0.0.10:81",
        "health: backend 10.0.2.13:8080 of VIP 10.0.0.10:80",
        "config ",
    ] {
        ensure!(log.contains(line), "the log lacks {line:?}");
    }
    let before = tb.daemon_log().lines().count();
    let batch = run_batch(tb, 100, 0, 4, 8_000_000)?;
    drop(batch);
    std::thread::sleep(Duration::from_millis(500));
    let after = tb.daemon_log().lines().count();
    ensure!(
        after - before <= 2,
        "100 connections wrote {} log lines",
        after - before
    );
    println!(
        "operator: the log named every change (and the refused one), the attach and the health \
         transition; 100 connections wrote {} lines",
        after - before
    );
    Ok(())
}

/// A flow table of 64 entries: 60 connections opened and left idle (no
/// data, so nothing waits on a connection whose flow goes) put it past
/// 90 %, warned about once; 40 more make the LRU table evict live flows,
/// whose counts reconciliation corrects, warned about once; neither
/// warning repeats within its 10 s.
fn table_filling(tb: &mut Testbed) -> anyhow::Result<()> {
    tb.stop_daemon();
    tb.daemon_args = vec!["--fresh".into(), "--flow-table-size".into(), "64".into()];
    tb.start_daemon()?;
    let before = tb.daemon_log();
    let open = |n: usize| {
        let ns = tb.client_ns_path();
        std::thread::spawn(move || -> anyhow::Result<Vec<std::net::TcpStream>> {
            crate::netns::enter_ns(&ns)?;
            let mut held = Vec::new();
            for _ in 0..n {
                if let Ok(s) = std::net::TcpStream::connect_timeout(&VIP, Duration::from_secs(2)) {
                    held.push(s);
                }
            }
            Ok(held)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the client thread panicked"))?
    };
    let warnings = |since: usize| {
        let log = tb.daemon_log();
        let new = log[since..].to_string();
        (
            new.matches("the flow table holds").count(),
            new.matches("evicted from a full flow table").count(),
            new,
        )
    };
    let mut opened = open(60)?;
    std::thread::sleep(Duration::from_millis(2500));
    let s = tb.stats()?;
    let (full, evicted, new) = warnings(before.len());
    ensure!(
        full == 1 && (evicted == 1) == (s.reconciled > 0),
        "{full} warnings of a full table and {evicted} of evicted flows in 2.5 s ({} \
         connections, {} entries, {} live, {} reconciled):\n{new}",
        opened.len(),
        s.flow_table_entries,
        s.live_flows,
        s.reconciled
    );
    let first = (s.live_flows, s.reconciled);
    // 40 more: live flows must go, and their counts be corrected; the full
    // table is not warned about again within 10 s.
    opened.extend(open(40)?);
    std::thread::sleep(Duration::from_millis(2500));
    let s = tb.stats()?;
    let (full, evicted, new) = warnings(before.len());
    ensure!(
        full == 1 && evicted == 1 && s.reconciled > 0 && s.live_flows <= 64,
        "after {} connections: {full} warnings of a full table, {evicted} of evicted flows ({} \
         entries, {} live, {} reconciled):\n{new}",
        opened.len(),
        s.flow_table_entries,
        s.live_flows,
        s.reconciled
    );
    drop(opened);
    println!(
        "operator: a 64-entry flow table: 60 idle connections kept {} live flows ({} counts \
         corrected), warned about once as full; 40 more left {} live and counts corrected by \
         {}, warned about once as evicting; the full table not warned about again (rate-limited)",
        first.0, first.1, s.live_flows, s.reconciled
    );
    Ok(())
}
