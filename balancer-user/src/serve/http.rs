//! The control API over HTTP/1.1 on unix sockets (axum on hyper): the
//! resources below, JSON in and out, one request per connection. The main
//! socket is for root only (the daemon checks the peer's credentials); an
//! optional read-only socket, for monitoring, answers only `GET` and is
//! opened to a group by its file mode. Every answer's body is a
//! [`Response`]: an object tagged by `result`, `error` ones with their
//! `status`. `GET /v1/openapi.json` describes it all, generated from the
//! handlers' annotations (utoipa).
//!
//! ```text
//! curl --unix-socket /run/p2c-balancer/control.sock http://localhost/v1/vips
//! curl --unix-socket ... -X POST -d '{"vip":"192.0.2.10:443","settings":{"choices":2}}' http://localhost/v1/vips
//! ```
//!
//! Addresses in paths are `ADDR:PORT`, an IPv6 one in brackets and
//! percent-encoded (`%5B2001:db8::10%5D:443`). A client may send
//! `x-deadline-unix-ms`: the moment (ms since the Unix epoch) it stops
//! waiting; a request that reaches the front of the queue later is not
//! started (408), so a change the client gave up on is never applied late.

use std::{net::SocketAddr, sync::Arc, time::Instant};

use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
    Router,
};
use hyper_util::{rt::TokioIo, rt::TokioTimer};
use serde::{Deserialize, Serialize};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use utoipa::{OpenApi, ToSchema};

use crate::{
    model::{
        api::{BackendPatch, FlowFilter, Request, Response, VipPatch},
        config::Config,
        state::VipSettings,
    },
    serve::control::{
        handle, past_deadline, req_name, RateLimitedLog, Shared, ANSWER_TIMEOUT, BUSY,
        MAX_ACCEPT_BACKOFF, MAX_CONNECTIONS, MAX_REQUEST, REQUEST_TIMEOUT,
    },
};

/// Who a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everything, for root only (checked on the peer's credentials).
    Root,
    /// `GET` only, for whoever the socket's mode lets connect.
    ReadOnly,
}

/// The header carrying a client's deadline.
pub const DEADLINE_HEADER: &str = "x-deadline-unix-ms";

/// `POST /v1/vips`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct AddVipBody {
    /// Address and port.
    #[schema(value_type = String)]
    pub vip: SocketAddr,
    /// Its settings (each missing one takes its default).
    #[serde(default)]
    pub settings: Option<VipSettings>,
}

/// `POST /v1/vips/{vip}/backends`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct AddBackendsBody {
    /// Backend addresses and ports: all of them are added, or none.
    #[schema(value_type = Vec<String>)]
    pub backends: Vec<SocketAddr>,
    /// Their weight (1 when absent).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Their zone (none when absent).
    #[serde(default)]
    pub zone: Option<String>,
}

/// `POST /v1/detach`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct DetachBody {
    /// Also remove the pinned maps.
    #[serde(default)]
    pub remove_maps: bool,
    /// The pin directory the sender means (refused when the daemon's is
    /// another).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub pin_dir: Option<std::path::PathBuf>,
}

/// `PUT /v1/config`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
pub struct ApplyBody {
    /// The desired configuration.
    pub config: Config,
    /// Only list the changes.
    #[serde(default)]
    pub dry_run: bool,
    /// Let a configuration without VIPs remove every running VIP (refused
    /// otherwise).
    #[serde(default)]
    pub allow_empty: bool,
    /// Make the running state exactly the configuration (runtime drains,
    /// weights and backends the file did not make are undone); otherwise
    /// what the file changed since its last apply is merged in.
    #[serde(default)]
    pub exact: bool,
    /// Which file it is (its absolute path): the base of the merge is that
    /// file as last applied. Absent: `api`.
    #[serde(default)]
    pub source: Option<String>,
}

/// `GET /v1/flows` query.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowsQuery {
    /// At most this many flows (at most 10,000; default 100).
    #[serde(default = "default_limit")]
    pub limit: usize,
    /// Only this VIP's flows.
    #[serde(default)]
    pub vip: Option<SocketAddr>,
    /// Only this backend's flows.
    #[serde(default)]
    pub backend: Option<SocketAddr>,
    /// Only flows of this kind (`live`, `half-open`, `unproven`, `synced`,
    /// `closed`).
    #[serde(default)]
    pub kind: Option<String>,
}

fn default_limit() -> usize {
    100
}

/// The path and method of each request (the CLI's side of [`router`]).
pub fn route(req: &Request) -> (&'static str, String, Option<serde_json::Value>) {
    use serde_json::json;
    let seg = |a: &SocketAddr| path_segment(a);
    match req {
        Request::AddVip { vip, settings } => (
            "POST",
            "/v1/vips".into(),
            Some(json!({"vip": vip, "settings": settings})),
        ),
        Request::SetVip { vip, patch } => (
            "PATCH",
            format!("/v1/vips/{}", seg(vip)),
            Some(json!(patch)),
        ),
        Request::RemoveVip { vip } => ("DELETE", format!("/v1/vips/{}", seg(vip)), None),
        Request::ListVips => ("GET", "/v1/vips".into(), None),
        Request::AddBackends {
            vip,
            backends,
            weight,
            zone,
        } => (
            "POST",
            format!("/v1/vips/{}/backends", seg(vip)),
            // `zone` only when given: a daemon older than zones refuses
            // the field.
            Some(match zone {
                Some(z) => json!({"backends": backends, "weight": weight, "zone": z}),
                None => json!({"backends": backends, "weight": weight}),
            }),
        ),
        Request::SetBackend {
            vip,
            backend,
            patch,
        } => (
            "PATCH",
            format!("/v1/vips/{}/backends/{}", seg(vip), seg(backend)),
            Some(json!(patch)),
        ),
        Request::DrainBackend { vip, backend } => (
            "POST",
            format!("/v1/vips/{}/backends/{}/drain", seg(vip), seg(backend)),
            None,
        ),
        Request::UndrainBackend { vip, backend } => (
            "POST",
            format!("/v1/vips/{}/backends/{}/undrain", seg(vip), seg(backend)),
            None,
        ),
        Request::RemoveBackend { vip, backend } => (
            "DELETE",
            format!("/v1/vips/{}/backends/{}", seg(vip), seg(backend)),
            None,
        ),
        Request::ListBackends { vip: Some(v) } => {
            ("GET", format!("/v1/vips/{}/backends", seg(v)), None)
        }
        Request::ListBackends { vip: None } => ("GET", "/v1/backends".into(), None),
        Request::Stats => ("GET", "/v1/stats".into(), None),
        Request::Flows { limit, filter } => {
            let mut q = format!("/v1/flows?limit={limit}");
            if let Some(v) = filter.vip {
                q.push_str(&format!("&vip={}", seg(&v)));
            }
            if let Some(b) = filter.backend {
                q.push_str(&format!("&backend={}", seg(&b)));
            }
            if let Some(k) = &filter.kind {
                q.push_str(&format!("&kind={k}"));
            }
            ("GET", q, None)
        }
        Request::Health => ("GET", "/v1/health".into(), None),
        Request::Version => ("GET", "/v1/version".into(), None),
        Request::Export => ("GET", "/v1/config".into(), None),
        Request::Apply {
            config,
            dry_run,
            allow_empty,
            exact,
            source,
        } => (
            "PUT",
            "/v1/config".into(),
            Some(
                json!({"config": config, "dry_run": dry_run, "allow_empty": allow_empty, "exact": exact, "source": source}),
            ),
        ),
        Request::ClusterStatus => ("GET", "/v1/cluster".into(), None),
        Request::ClusterDrain { drained: true } => ("POST", "/v1/cluster/drain".into(), None),
        Request::ClusterDrain { drained: false } => ("POST", "/v1/cluster/undrain".into(), None),
        Request::Detach {
            remove_maps,
            pin_dir,
        } => (
            "POST",
            "/v1/detach".into(),
            Some(json!({"remove_maps": remove_maps, "pin_dir": pin_dir})),
        ),
    }
}

/// An address as a path segment: `10.0.0.10:80`, `%5B2001:db8::10%5D:80`.
pub fn path_segment(a: &SocketAddr) -> String {
    a.to_string().replace('[', "%5B").replace(']', "%5D")
}

type St = Arc<Shared>;

fn parse_addr(s: &str) -> Result<SocketAddr, Response> {
    s.parse().map_err(|_| {
        Response::error(
            400,
            format!("{s:?} is not an address and port (ADDR:PORT, [IPv6]:PORT)"),
        )
    })
}

/// Reads a JSON body into `T`, refusing any field `T` does not have (at
/// any depth: a misspelt `dry_run` must not apply a change meant as a
/// dry run, a misspelt setting must not be dropped).
fn parse_body<T: serde::de::DeserializeOwned + ToSchema>(b: &Bytes) -> Result<T, Response> {
    let mut unknown: Vec<Vec<Segment>> = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let mut de = serde_json::Deserializer::from_slice(b);
    let v: Result<T, _> = serde_ignored::deserialize(
        serde_path_to_error::Deserializer::new(&mut de, &mut track),
        |path| unknown.push(segments(path)),
    );
    let v = match v.and_then(|v| de.end().map(|()| v)) {
        Ok(v) => v,
        Err(e) => {
            // Where the value is (`config.vip[0].health`), unless the
            // whole body is refused.
            let at = track.path().to_string();
            let at = if at == "." {
                String::new()
            } else {
                format!("{at}: ")
            };
            return Err(Response::error(400, format!("bad request body: {at}{e}")));
        }
    };
    if !unknown.is_empty() {
        let doc: serde_json::Value =
            serde_json::from_str(&openapi_json()).unwrap_or(serde_json::Value::Null);
        let names: Vec<String> = unknown
            .iter()
            .map(|p| {
                let hint = p
                    .split_last()
                    .and_then(|(last, parent)| match last {
                        Segment::Key(k) => closest(k, &known_fields(&doc, &T::name(), parent)),
                        Segment::Index(_) => None,
                    })
                    .map_or(String::new(), |k| format!(" (did you mean `{k}`)"));
                format!("`{}`{hint}", path_text(p))
            })
            .collect();
        return Err(Response::error(
            400,
            format!(
                "bad request body: unknown field{} {} (see GET /v1/openapi.json)",
                if unknown.len() > 1 { "s" } else { "" },
                names.join(", ")
            ),
        ));
    }
    Ok(v)
}

/// One step of a path into a request body.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    /// An object's key.
    Key(String),
    /// A list's element.
    Index(usize),
}

/// The steps of `p` (an `Option`'s or a newtype's wrapping is no step).
fn segments(p: serde_ignored::Path<'_>) -> Vec<Segment> {
    fn walk(p: &serde_ignored::Path<'_>, out: &mut Vec<Segment>) {
        use serde_ignored::Path as P;
        match p {
            P::Root => {}
            P::Seq { parent, index } => {
                walk(parent, out);
                out.push(Segment::Index(*index));
            }
            P::Map { parent, key } => {
                walk(parent, out);
                out.push(Segment::Key(key.clone()));
            }
            P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
                walk(parent, out)
            }
        }
    }
    let mut out = Vec::new();
    walk(&p, &mut out);
    out
}

/// `settings.choise`, `vips[0].address`.
fn path_text(p: &[Segment]) -> String {
    let mut s = String::new();
    for seg in p {
        match seg {
            Segment::Key(k) if s.is_empty() => s.push_str(k),
            Segment::Key(k) => {
                s.push('.');
                s.push_str(k);
            }
            Segment::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The field names the OpenAPI description `doc` knows at `path` inside
/// the schema `schema` (its `$ref`s, `oneOf`, `anyOf` and `allOf`
/// followed).
fn known_fields(
    doc: &serde_json::Value,
    schema: &str,
    path: &[Segment],
) -> std::collections::BTreeSet<String> {
    fn at(
        doc: &serde_json::Value,
        s: &serde_json::Value,
        path: &[Segment],
        depth: usize,
        out: &mut std::collections::BTreeSet<String>,
    ) {
        if depth > 32 {
            return;
        }
        if let Some(r) = s.get("$ref").and_then(|r| r.as_str()) {
            let name = r.rsplit('/').next().unwrap_or_default();
            if let Some(t) = doc.pointer(&format!("/components/schemas/{name}")) {
                at(doc, t, path, depth + 1, out);
            }
            return;
        }
        for alt in ["oneOf", "anyOf", "allOf"] {
            for a in s.get(alt).and_then(|a| a.as_array()).into_iter().flatten() {
                at(doc, a, path, depth + 1, out);
            }
        }
        match path.split_first() {
            None => {
                if let Some(p) = s.get("properties").and_then(|p| p.as_object()) {
                    out.extend(p.keys().cloned());
                }
            }
            Some((Segment::Key(k), rest)) => {
                if let Some(t) = s.get("properties").and_then(|p| p.get(k)) {
                    at(doc, t, rest, depth + 1, out);
                } else if let Some(t) = s.get("additionalProperties") {
                    at(doc, t, rest, depth + 1, out);
                }
            }
            Some((Segment::Index(_), rest)) => {
                if let Some(t) = s.get("items") {
                    at(doc, t, rest, depth + 1, out);
                }
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    if let Some(s) = doc.pointer(&format!("/components/schemas/{schema}")) {
        at(doc, s, path, 0, &mut out);
    }
    out
}

/// The name of `known` closest to `got` (at most a third of its letters
/// apart, at least one), if any.
fn closest(got: &str, known: &std::collections::BTreeSet<String>) -> Option<String> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    let limit = (got.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (distance(got, k), k))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, k)| k.clone())
}

/// The client's deadline, if it sent one.
///
/// # Errors
/// A 400 answer when the header is not a number of ms.
fn deadline(h: &HeaderMap) -> Result<Option<u64>, Response> {
    let Some(v) = h.get(DEADLINE_HEADER) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| {
            Response::error(
                400,
                format!(
                    "{DEADLINE_HEADER} must be the moment the client stops waiting, in ms since \
                     the Unix epoch; got {:?}",
                    String::from_utf8_lossy(v.as_bytes())
                ),
            )
        })
}

/// A 408 answer when the request, now at the front of the queue, is past
/// its sender's deadline (logged: it is not started).
fn late(what: &str, d: Option<u64>) -> Option<Response> {
    if !past_deadline(d) {
        return None;
    }
    tracing::warn!("control: a request arrived after its sender's deadline; not applied ({what})");
    Some(Response::error(
        408,
        "the request reached the daemon after its deadline; not applied",
    ))
}

/// Runs `req` on the balancer (one at a time, in arrival order) and
/// answers it.
async fn run(
    st: &Shared,
    h: &HeaderMap,
    req: Result<Request, Response>,
) -> axum::response::Response {
    let resp = match deadline(h).and_then(|d| req.map(|r| (d, r))) {
        Err(r) => r,
        Ok((d, req)) => {
            let mut lb = st.lb.lock().await;
            // Checked once the lock is held: the request starts now.
            if let Some(r) = late(&req_name(&req), d) {
                r
            } else {
                let detach = matches!(req, Request::Detach { .. });
                let r = {
                    let mut store = st.store.lock().unwrap_or_else(|p| p.into_inner());
                    handle(&mut lb, req, &mut store)
                };
                if detach && matches!(r, Response::Detached { .. }) {
                    st.stop.notify_one();
                }
                r
            }
        }
    };
    answer(resp)
}

/// A [`Response`] as an HTTP answer, with its status.
pub fn answer(resp: Response) -> axum::response::Response {
    let status = match &resp {
        Response::Error { status, .. } => {
            StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        }
        _ => StatusCode::OK,
    };
    let body = serde_json::to_vec(&resp).unwrap_or_default();
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// List the VIPs.
#[utoipa::path(get, path = "/v1/vips", responses((status = 200, body = Response, description = "`{\"result\":\"vips\",\"vips\":[...]}`")))]
async fn list_vips(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::ListVips)).await
}

/// Add a VIP.
#[utoipa::path(post, path = "/v1/vips", request_body = AddVipBody, responses((status = 200, body = Response), (status = 400, body = Response), (status = 409, body = Response)))]
async fn add_vip(State(st): State<St>, h: HeaderMap, b: Bytes) -> axum::response::Response {
    let req = parse_body::<AddVipBody>(&b).map(|b| Request::AddVip {
        vip: b.vip,
        settings: b.settings.unwrap_or_default(),
    });
    run(&st, &h, req).await
}

/// One VIP.
#[utoipa::path(get, path = "/v1/vips/{vip}", params(("vip" = String, Path, description = "ADDR:PORT")), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn get_vip(
    State(st): State<St>,
    Path(vip): Path<String>,
    h: HeaderMap,
) -> axum::response::Response {
    let resp = match parse_addr(&vip).and_then(|v| deadline(&h).map(|d| (v, d))) {
        Err(r) => r,
        Ok((v, d)) => {
            let lb = st.lb.lock().await;
            if let Some(r) = late("get_vip", d) {
                r
            } else {
                let vips: Vec<_> = lb.list_vips().into_iter().filter(|x| x.vip == v).collect();
                if vips.is_empty() {
                    Response::error(404, format!("no VIP {v}"))
                } else {
                    Response::Vips { vips }
                }
            }
        }
    };
    answer(resp)
}

/// Change a VIP's settings (all of the patch, or nothing).
#[utoipa::path(patch, path = "/v1/vips/{vip}", request_body = VipPatch, params(("vip" = String, Path)), responses((status = 200, body = Response), (status = 400, body = Response), (status = 404, body = Response)))]
async fn set_vip(
    State(st): State<St>,
    Path(vip): Path<String>,
    h: HeaderMap,
    b: Bytes,
) -> axum::response::Response {
    let req = parse_addr(&vip)
        .and_then(|vip| parse_body::<VipPatch>(&b).map(|patch| Request::SetVip { vip, patch }));
    run(&st, &h, req).await
}

/// Remove a VIP, its backends and its flows.
#[utoipa::path(delete, path = "/v1/vips/{vip}", params(("vip" = String, Path)), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn remove_vip(
    State(st): State<St>,
    Path(vip): Path<String>,
    h: HeaderMap,
) -> axum::response::Response {
    let req = parse_addr(&vip).map(|vip| Request::RemoveVip { vip });
    run(&st, &h, req).await
}

/// List a VIP's backends.
#[utoipa::path(get, path = "/v1/vips/{vip}/backends", params(("vip" = String, Path)), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn list_vip_backends(
    State(st): State<St>,
    Path(vip): Path<String>,
    h: HeaderMap,
) -> axum::response::Response {
    let req = parse_addr(&vip).map(|v| Request::ListBackends { vip: Some(v) });
    run(&st, &h, req).await
}

/// Add backends to a VIP (all of them, or none).
#[utoipa::path(post, path = "/v1/vips/{vip}/backends", request_body = AddBackendsBody, params(("vip" = String, Path)), responses((status = 200, body = Response), (status = 400, body = Response), (status = 404, body = Response)))]
async fn add_backends(
    State(st): State<St>,
    Path(vip): Path<String>,
    h: HeaderMap,
    b: Bytes,
) -> axum::response::Response {
    let req = parse_addr(&vip).and_then(|vip| {
        parse_body::<AddBackendsBody>(&b).and_then(|b| {
            if b.backends.is_empty() {
                return Err(Response::error(
                    400,
                    "bad request body: `backends` is empty",
                ));
            }
            Ok(Request::AddBackends {
                vip,
                backends: b.backends,
                weight: b.weight,
                zone: b.zone,
            })
        })
    });
    run(&st, &h, req).await
}

/// Change a backend's weight or health check.
#[utoipa::path(patch, path = "/v1/vips/{vip}/backends/{backend}", request_body = BackendPatch, params(("vip" = String, Path), ("backend" = String, Path)), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn set_backend(
    State(st): State<St>,
    Path((vip, backend)): Path<(String, String)>,
    h: HeaderMap,
    b: Bytes,
) -> axum::response::Response {
    let req = parse_addr(&vip).and_then(|vip| {
        parse_addr(&backend).and_then(|backend| {
            parse_body::<BackendPatch>(&b).map(|patch| Request::SetBackend {
                vip,
                backend,
                patch,
            })
        })
    });
    run(&st, &h, req).await
}

/// Remove a backend (its clients' next segments get a reset).
#[utoipa::path(delete, path = "/v1/vips/{vip}/backends/{backend}", params(("vip" = String, Path), ("backend" = String, Path)), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn remove_backend(
    State(st): State<St>,
    Path((vip, backend)): Path<(String, String)>,
    h: HeaderMap,
) -> axum::response::Response {
    let req = parse_addr(&vip).and_then(|vip| {
        parse_addr(&backend).map(|backend| Request::RemoveBackend { vip, backend })
    });
    run(&st, &h, req).await
}

/// Drain a backend: no new flows, its flows continue.
#[utoipa::path(post, path = "/v1/vips/{vip}/backends/{backend}/drain", params(("vip" = String, Path), ("backend" = String, Path)), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn drain_backend(
    State(st): State<St>,
    Path((vip, backend)): Path<(String, String)>,
    h: HeaderMap,
) -> axum::response::Response {
    let req = parse_addr(&vip)
        .and_then(|vip| parse_addr(&backend).map(|backend| Request::DrainBackend { vip, backend }));
    run(&st, &h, req).await
}

/// Put a drained backend back into service.
#[utoipa::path(post, path = "/v1/vips/{vip}/backends/{backend}/undrain", params(("vip" = String, Path), ("backend" = String, Path)), responses((status = 200, body = Response), (status = 404, body = Response)))]
async fn undrain_backend(
    State(st): State<St>,
    Path((vip, backend)): Path<(String, String)>,
    h: HeaderMap,
) -> axum::response::Response {
    let req = parse_addr(&vip).and_then(|vip| {
        parse_addr(&backend).map(|backend| Request::UndrainBackend { vip, backend })
    });
    run(&st, &h, req).await
}

/// Every backend of every VIP, with its counters.
#[utoipa::path(get, path = "/v1/backends", responses((status = 200, body = Response)))]
async fn list_backends(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::ListBackends { vip: None })).await
}

/// Every backend's health.
#[utoipa::path(get, path = "/v1/health", responses((status = 200, body = Response)))]
async fn health(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::Health)).await
}

/// All counters: global (`counters`, by name), per VIP, per backend.
#[utoipa::path(get, path = "/v1/stats", responses((status = 200, body = Response)))]
async fn stats(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::Stats)).await
}

/// Live flows.
#[utoipa::path(get, path = "/v1/flows", params(("limit" = Option<usize>, Query, description = "at most this many (default 100, at most 10,000)"), ("vip" = Option<String>, Query, description = "only this VIP's flows"), ("backend" = Option<String>, Query, description = "only this backend's flows"), ("kind" = Option<String>, Query, description = "only this kind: live, half-open, unproven, synced, closed")), responses((status = 200, body = Response), (status = 400, body = Response)))]
async fn flows(
    State(st): State<St>,
    Query(q): Query<FlowsQuery>,
    h: HeaderMap,
) -> axum::response::Response {
    let filter = FlowFilter {
        vip: q.vip,
        backend: q.backend,
        kind: q.kind,
    };
    run(
        &st,
        &h,
        Ok(Request::Flows {
            limit: q.limit,
            filter,
        }),
    )
    .await
}

/// The daemon's build.
#[utoipa::path(get, path = "/v1/version", responses((status = 200, body = Response)))]
async fn version(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::Version)).await
}

/// The running configuration in the declarative form.
#[utoipa::path(get, path = "/v1/config", responses((status = 200, body = Response)))]
async fn export(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::Export)).await
}

/// Make the running state match a configuration (every change, or none).
#[utoipa::path(put, path = "/v1/config", request_body = ApplyBody, responses((status = 200, body = Response), (status = 400, body = Response)))]
async fn apply(State(st): State<St>, h: HeaderMap, b: Bytes) -> axum::response::Response {
    let req = parse_body::<ApplyBody>(&b).map(|b| Request::Apply {
        config: b.config,
        dry_run: b.dry_run,
        allow_empty: b.allow_empty,
        exact: b.exact,
        source: b.source,
    });
    run(&st, &h, req).await
}

/// The cluster: peers, sync totals, BGP announcements, drain.
#[utoipa::path(get, path = "/v1/cluster", responses((status = 200, body = Response), (status = 400, body = Response)))]
async fn cluster(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::ClusterStatus)).await
}

/// Drain this balancer: its VIPs are withdrawn from BGP; what still
/// reaches it is forwarded.
#[utoipa::path(post, path = "/v1/cluster/drain", responses((status = 200, body = Response), (status = 400, body = Response)))]
async fn cluster_drain(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::ClusterDrain { drained: true })).await
}

/// Put a drained balancer back: its VIPs are announced again.
#[utoipa::path(post, path = "/v1/cluster/undrain", responses((status = 200, body = Response), (status = 400, body = Response)))]
async fn cluster_undrain(State(st): State<St>, h: HeaderMap) -> axum::response::Response {
    run(&st, &h, Ok(Request::ClusterDrain { drained: false })).await
}

/// Detach the program from every interface and stop the daemon.
#[utoipa::path(post, path = "/v1/detach", request_body = DetachBody, responses((status = 200, body = Response)))]
async fn detach(State(st): State<St>, h: HeaderMap, b: Bytes) -> axum::response::Response {
    let req = if b.is_empty() {
        Ok(DetachBody::default())
    } else {
        parse_body::<DetachBody>(&b)
    }
    .map(|b| Request::Detach {
        remove_maps: b.remove_maps,
        pin_dir: b.pin_dir,
    });
    run(&st, &h, req).await
}

/// The OpenAPI description of the control API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "p2c-balancer control API",
        description = "The daemon's control API, on its unix socket (HTTP/1.1, JSON)."
    ),
    paths(
        list_vips,
        add_vip,
        get_vip,
        set_vip,
        remove_vip,
        list_vip_backends,
        add_backends,
        set_backend,
        remove_backend,
        drain_backend,
        undrain_backend,
        list_backends,
        health,
        stats,
        flows,
        version,
        export,
        apply,
        cluster,
        cluster_drain,
        cluster_undrain,
        detach
    ),
    components(schemas(Response, AddVipBody, AddBackendsBody, DetachBody, ApplyBody))
)]
pub struct ApiDoc;

/// The OpenAPI description, as served at `/v1/openapi.json`.
pub fn openapi_json() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}

async fn openapi() -> axum::response::Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        openapi_json(),
    )
        .into_response()
}

async fn not_found() -> axum::response::Response {
    answer(Response::error(
        404,
        "no such resource (see GET /v1/openapi.json)",
    ))
}

async fn read_only() -> axum::response::Response {
    answer(Response::error(
        405,
        "this socket is read-only: only GET requests are served here",
    ))
}

/// The routes of a listener.
pub fn router(shared: St, access: Access) -> Router {
    let reads = Router::new()
        .route("/v1/vips", get(list_vips))
        .route("/v1/vips/{vip}", get(get_vip))
        .route("/v1/vips/{vip}/backends", get(list_vip_backends))
        .route("/v1/backends", get(list_backends))
        .route("/v1/health", get(health))
        .route("/v1/stats", get(stats))
        .route("/v1/flows", get(flows))
        .route("/v1/version", get(version))
        .route("/v1/config", get(export))
        .route("/v1/cluster", get(cluster))
        .route("/v1/openapi.json", get(openapi));
    let r = match access {
        // Paths with reads answer other methods 405; paths of changes only
        // answer every method 405.
        Access::ReadOnly => reads
            .route(
                "/v1/vips/{vip}/backends/{backend}",
                axum::routing::any(read_only),
            )
            .route(
                "/v1/vips/{vip}/backends/{backend}/drain",
                axum::routing::any(read_only),
            )
            .route(
                "/v1/vips/{vip}/backends/{backend}/undrain",
                axum::routing::any(read_only),
            )
            .route("/v1/detach", axum::routing::any(read_only))
            .route("/v1/cluster/drain", axum::routing::any(read_only))
            .route("/v1/cluster/undrain", axum::routing::any(read_only))
            .method_not_allowed_fallback(read_only),
        Access::Root => reads
            .route("/v1/vips", post(add_vip))
            .route(
                "/v1/vips/{vip}",
                axum::routing::patch(set_vip).delete(remove_vip),
            )
            .route("/v1/vips/{vip}/backends", post(add_backends))
            .route(
                "/v1/vips/{vip}/backends/{backend}",
                axum::routing::patch(set_backend).delete(remove_backend),
            )
            .route(
                "/v1/vips/{vip}/backends/{backend}/drain",
                post(drain_backend),
            )
            .route(
                "/v1/vips/{vip}/backends/{backend}/undrain",
                post(undrain_backend),
            )
            .route("/v1/config", axum::routing::put(apply))
            .route("/v1/cluster/drain", post(cluster_drain))
            .route("/v1/cluster/undrain", post(cluster_undrain))
            .route("/v1/detach", post(detach)),
    };
    r.fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_REQUEST))
        .with_state(shared)
}

/// A raw HTTP answer written without waiting (the busy and permission
/// answers, given before any request is read).
pub(crate) fn raw_answer(status: u16, reason: &str, message: &str) -> Vec<u8> {
    let body = serde_json::to_vec(&Response::error(status, message)).unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Accepts and serves connections on `listener` until `shutdown` is
/// cancelled; the connections being served then finish on their own.
pub async fn serve_control(
    listener: UnixListener,
    shared: St,
    access: Access,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = std::time::Duration::from_millis(10);
    let mut accept_log = RateLimitedLog::default();
    let mut busy_log = RateLimitedLog::default();
    let app = router(shared, access);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => {
                backoff = std::time::Duration::from_millis(10);
                s
            }
            Err(e) => {
                // EMFILE/ENFILE/ENOBUFS: the pending connection stays
                // queued; retrying at once would spin. Wait, doubling.
                accept_log.warn(Instant::now(), || {
                    format!(
                        "control socket: accept failed: {e}; retrying in {} ms",
                        backoff.as_millis()
                    )
                });
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            busy_log.warn(Instant::now(), || {
                format!("control socket: {MAX_CONNECTIONS} connections open, refusing more")
            });
            // Best effort, never waiting: the answer fits the socket buffer.
            let _ = stream.try_write(&raw_answer(503, "Service Unavailable", BUSY));
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(stream, app, access).await {
                tracing::debug!("control connection: {e:#}");
            }
            drop(permit);
        });
    }
}

async fn serve(stream: UnixStream, app: Router, access: Access) -> anyhow::Result<()> {
    let cred = stream.peer_cred()?;
    if access == Access::Root && cred.uid() != 0 {
        let _ = stream.try_write(&raw_answer(
            403,
            "Forbidden",
            "permission denied: the control socket is for root only",
        ));
        return Ok(());
    }
    let who = crate::serve::control::describe_peer(cred.pid(), cred.uid());
    crate::serve::control::CALLER
        .scope(who, serve_io(stream, app))
        .await
}

/// Serves one HTTP/1.1 request on `stream`. A client that does not send
/// its request in time, or does not read its answer, gives up its slot:
/// the header within [`REQUEST_TIMEOUT`] (hyper's header timeout), the
/// body within [`REQUEST_TIMEOUT`] more and at most [`MAX_REQUEST`] bytes,
/// the answer written with progress at least every [`ANSWER_TIMEOUT`].
/// Once the request is read nothing times out while it waits for the
/// balancer (a long `apply` ahead of it in the queue): it is answered.
/// Every error answer, the router's own rejections included, is a JSON
/// [`Response::Error`].
async fn serve_io<S>(stream: S, app: Router) -> anyhow::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_write_timeout(Some(ANSWER_TIMEOUT));
    let io = Box::pin(io);
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let app = app.clone();
        async move {
            Ok::<_, std::convert::Infallible>(match read_request(req).await {
                Ok(req) => {
                    let resp = tower::ServiceExt::oneshot(app, req)
                        .await
                        .unwrap_or_else(|e| match e {});
                    json_errors(resp).await
                }
                Err(resp) => answer(resp),
            })
        }
    });
    hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .serve_connection(TokioIo::new(io), svc)
        .await?;
    Ok(())
}

/// Reads a request's body within [`REQUEST_TIMEOUT`] and [`MAX_REQUEST`]
/// bytes.
///
/// # Errors
/// The error answer: 408 (too slow), 413 (too large), 400 (the body ends
/// early or is malformed).
async fn read_request(
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<axum::extract::Request, Response> {
    use http_body_util::BodyExt;
    let (parts, body) = req.into_parts();
    if hyper::body::Body::size_hint(&body).lower() > MAX_REQUEST as u64 {
        return Err(Response::error(
            413,
            format!("the request body is over {MAX_REQUEST} bytes"),
        ));
    }
    let limited = http_body_util::Limited::new(body, MAX_REQUEST);
    let bytes = match tokio::time::timeout(REQUEST_TIMEOUT, limited.collect()).await {
        Err(_) => {
            return Err(Response::error(
                408,
                format!(
                    "the request body did not arrive within {} s",
                    REQUEST_TIMEOUT.as_secs()
                ),
            ))
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(Response::error(
                413,
                format!("the request body is over {MAX_REQUEST} bytes"),
            ))
        }
        Ok(Err(e)) => {
            return Err(Response::error(
                400,
                format!("reading the request body: {e}"),
            ))
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    Ok(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
}

/// An error answer the router wrote as plain text (a path that is not
/// UTF-8, a bad query string, a method a path does not serve) as a JSON
/// [`Response::Error`] with the same status and its text as the message.
async fn json_errors(resp: axum::response::Response) -> axum::response::Response {
    use http_body_util::BodyExt;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = match resp.into_body().collect().await {
        Ok(c) => String::from_utf8_lossy(&c.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    answer(Response::error(status.as_u16(), message))
}

/// `GET /metrics` (and `/`): the Prometheus text exposition.
async fn scrape(State(src): State<Arc<crate::serve::metrics::Source>>) -> axum::response::Response {
    let text = {
        let lb = src.lb.lock().await;
        lb.stats().map(|s| {
            crate::serve::metrics::render_status(
                &s,
                lb.cluster_view(),
                lb.vrrp().as_deref(),
                &src.daemon,
            )
        })
    };
    match text {
        Ok(t) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            t,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the maps failed: {e}\n"),
        )
            .into_response(),
    }
}

/// Serves Prometheus scrapes on `listener` until `shutdown` is cancelled:
/// at most [`MAX_CONNECTIONS`] at once (more are closed at once), the same
/// timeouts as the control socket.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    src: Arc<crate::serve::metrics::Source>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut accept_log = RateLimitedLog::default();
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/", get(scrape))
        .with_state(src);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                accept_log.warn(Instant::now(), || {
                    format!("metrics listener: accept failed: {e}")
                });
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_io(stream, app).await {
                tracing::debug!("metrics connection: {e:#}");
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends `request` over an in-memory stream to `app` served by
    /// [`serve_io`] and returns what came back (status line and body).
    async fn exchange(app: Router, request: Vec<u8>, pause: Duration) -> (u16, serde_json::Value) {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve_io(server, app));
        client.write_all(&request).await.unwrap();
        tokio::time::sleep(pause).await;
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        let _ = served.await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (
            status,
            serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        )
    }

    use std::time::Duration;

    fn slow_app(wait: Duration) -> Router {
        Router::new().route(
            "/slow",
            get(move || async move {
                tokio::time::sleep(wait).await;
                answer(Response::Ok)
            }),
        )
    }

    #[tokio::test]
    async fn a_request_waiting_longer_than_the_read_timeout_is_answered() {
        // The handler stands for a request queued behind a long apply.
        let wait = REQUEST_TIMEOUT + Duration::from_millis(1500);
        let (status, body) = exchange(
            slow_app(wait),
            b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            Duration::ZERO,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"], "ok");
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_a_json_408() {
        let (status, body) = exchange(
            slow_app(Duration::ZERO),
            b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc".to_vec(),
            Duration::ZERO,
        )
        .await;
        assert_eq!(
            (status, body["status"].as_u64()),
            (408, Some(408)),
            "{body}"
        );
    }

    #[tokio::test]
    async fn router_rejections_are_json_error_objects() {
        for (req, want) in [
            (&b"DELETE /slow HTTP/1.1\r\nhost: x\r\n\r\n"[..], 405),
            (b"GET /nowhere HTTP/1.1\r\nhost: x\r\n\r\n", 404),
        ] {
            let app = slow_app(Duration::ZERO).fallback(not_found);
            let (status, body) = exchange(app, req.to_vec(), Duration::ZERO).await;
            assert_eq!(status, want);
            assert_eq!(body["result"], "error", "{body}");
            assert_eq!(body["status"], want);
        }
        let mut big = format!(
            "POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            MAX_REQUEST + 10
        )
        .into_bytes();
        big.extend(std::iter::repeat_n(b'x', 1000));
        // The length alone is over the limit: refused before the body.
        let (status, body) = exchange(slow_app(Duration::ZERO), big, Duration::ZERO).await;
        assert_eq!(
            (status, body["status"].as_u64()),
            (413, Some(413)),
            "{body}"
        );
    }

    #[test]
    fn unknown_fields_are_refused_at_any_depth() {
        let ok: Result<ApplyBody, _> = parse_body(&Bytes::from_static(br#"{"config":{}}"#));
        assert!(ok.is_ok());
        for body in [
            &br#"{"config":{},"dryrun":true}"#[..],
            br#"{"vip":"10.0.0.1:80","settings":{"chioces":2}}"#,
        ] {
            let b = Bytes::copy_from_slice(body);
            let e = if body.starts_with(b"{\"config") {
                parse_body::<ApplyBody>(&b).unwrap_err()
            } else {
                parse_body::<AddVipBody>(&b).unwrap_err()
            };
            let Response::Error {
                status, message, ..
            } = e
            else {
                panic!("not an error")
            };
            assert_eq!(status, 400);
            assert!(message.contains("unknown field"), "{message}");
        }
        let p: Result<VipPatch, _> = parse_body(&Bytes::from_static(
            br#"{"health":{"check":{"kind":{"type":"tcp"},"intervall":"1s"}}}"#,
        ));
        assert!(p.is_err());
        // Every field of a check may be left out.
        let p: VipPatch =
            parse_body(&Bytes::from_static(br#"{"health":{"check":{"rise":4}}}"#)).unwrap();
        let Some(crate::model::api::HealthSetting::Check(h)) = p.health else {
            panic!("no check")
        };
        assert_eq!(
            (h.rise, h.fall),
            (4, crate::model::state::HealthCheck::default().fall)
        );
    }

    /// An unknown field is named where it is (`settings.choise`, not
    /// `settings.?.choise`), with the known field it is closest to.
    #[test]
    fn an_unknown_field_is_named_where_it_is() {
        let message =
            |body: &'static [u8]| match parse_body::<AddVipBody>(&Bytes::from_static(body)) {
                Err(Response::Error { message, .. }) => message,
                other => panic!("not refused: {other:?}"),
            };
        let m = message(br#"{"vip":"10.0.0.1:80","settings":{"choise":2}}"#);
        assert!(m.contains("settings.choise"), "{m}");
        assert!(!m.contains('?'), "{m}");
        assert!(m.contains("did you mean `choices`"), "{m}");
        let m = message(br#"{"vip":"10.0.0.1:80","settings":{"allow_sources":[],"zzzzzzzzzz":1}}"#);
        assert!(m.contains("settings.zzzzzzzzzz"), "{m}");
        assert!(!m.contains("did you mean"), "{m}");
        // A list's element by its index.
        let p = parse_body::<BackendPatch>(&Bytes::from_static(br#"{"weight":2,"helth":"off"}"#));
        let Err(Response::Error { message, .. }) = p else {
            panic!("not refused")
        };
        assert!(
            message.contains("`helth`") && message.contains("did you mean `health`"),
            "{message}"
        );
        // A file's VIP refuses unknown keys itself: the error is placed.
        let p = parse_body::<ApplyBody>(&Bytes::from_static(
            br#"{"config":{"vip":[{"address":"10.0.0.1:80"},{"address":"10.0.0.2:80","choise":2}]}}"#,
        ));
        let Err(Response::Error { message, .. }) = p else {
            panic!("not refused")
        };
        assert!(message.contains("config.vip[1]"), "{message}");
        assert!(message.contains("unknown field `choise`"), "{message}");
    }

    #[tokio::test]
    async fn a_refusal_answers_its_vip_field_and_reason_as_keys() {
        use crate::model::{
            error::{error_chain, Reason},
            state::{HealthCheck, VipSettings},
        };
        let vip: SocketAddr = "10.0.0.10:80".parse().unwrap();
        let s = VipSettings {
            health: Some(HealthCheck {
                interval: Duration::from_millis(5),
                ..HealthCheck::default()
            }),
            ..VipSettings::default()
        };
        // As `control::handle` answers a refused request.
        let e = s.validate_for(vip).unwrap_err().in_vip(vip);
        let resp = Response::refused(
            crate::serve::control::status_of(&e),
            error_chain(&e),
            e.refusal(),
        );
        let app = Router::new().route("/refused", get(move || async move { answer(resp) }));
        let (status, body) = exchange(
            app,
            b"GET /refused HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            Duration::ZERO,
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(
            body,
            serde_json::json!({
                "result": "error",
                "status": 400,
                "message": "VIP 10.0.0.10:80: health.interval: 5ms is outside 10ms..=1h",
                "vip": "10.0.0.10:80",
                "field": "health.interval",
                "reason": {"kind": "out_of_range", "got": "5ms", "min": "10ms", "max": "1h"},
            })
        );
        // The client reads it back; an error of no refusal has none of the
        // new keys (the body clients read before).
        let Response::Error { reason, field, .. } = serde_json::from_value(body).unwrap() else {
            panic!("not an error")
        };
        assert_eq!(field.as_deref(), Some("health.interval"));
        assert!(matches!(reason.as_deref(), Some(Reason::OutOfRange { .. })));
        let plain = serde_json::to_value(Response::error(404, "no VIP 10.0.0.9:80")).unwrap();
        assert_eq!(
            plain,
            serde_json::json!({"result": "error", "status": 404, "message": "no VIP 10.0.0.9:80"})
        );
        // The OpenAPI schema describes the keys.
        let doc: serde_json::Value = serde_json::from_str(&openapi_json()).unwrap();
        let text = doc["components"]["schemas"].to_string();
        for k in ["\"field\"", "\"reason\"", "out_of_range", "forwarding_loop"] {
            assert!(text.contains(k), "{k} not in the schemas");
        }
    }

    #[test]
    fn a_deadline_that_is_not_a_number_is_a_400() {
        let mut h = HeaderMap::new();
        assert!(matches!(deadline(&h), Ok(None)));
        h.insert(DEADLINE_HEADER, "soon".parse().unwrap());
        assert!(matches!(
            deadline(&h),
            Err(Response::Error { status: 400, .. })
        ));
        h.insert(DEADLINE_HEADER, "1700000000000".parse().unwrap());
        assert!(matches!(deadline(&h), Ok(Some(1_700_000_000_000))));
    }
}
