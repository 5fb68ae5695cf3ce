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
use hyper_util::{rt::TokioIo, rt::TokioTimer, service::TowerToHyperService};
use serde::{Deserialize, Serialize};
use tokio::net::{UnixListener, UnixStream};
use utoipa::{OpenApi, ToSchema};

use crate::{
    api::{BackendPatch, Request, Response, VipPatch},
    config::Config,
    control::{
        handle, past_deadline, req_name, RateLimitedLog, Shared, ANSWER_TIMEOUT, BUSY,
        MAX_ACCEPT_BACKOFF, MAX_CONNECTIONS, MAX_REQUEST, REQUEST_TIMEOUT,
    },
    state::VipSettings,
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
}

/// `GET /v1/flows` query.
#[derive(Clone, Debug, Deserialize)]
pub struct FlowsQuery {
    /// At most this many flows (at most 10,000; default 100).
    #[serde(default = "default_limit")]
    pub limit: usize,
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
        } => (
            "POST",
            format!("/v1/vips/{}/backends", seg(vip)),
            Some(json!({"backends": backends, "weight": weight})),
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
        Request::Flows { limit } => ("GET", format!("/v1/flows?limit={limit}"), None),
        Request::Health => ("GET", "/v1/health".into(), None),
        Request::Version => ("GET", "/v1/version".into(), None),
        Request::Export => ("GET", "/v1/config".into(), None),
        Request::Apply { config, dry_run } => (
            "PUT",
            "/v1/config".into(),
            Some(json!({"config": config, "dry_run": dry_run})),
        ),
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

fn parse_body<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(b).map_err(|e| Response::error(400, format!("bad request body: {e}")))
}

fn deadline(h: &HeaderMap) -> Option<u64> {
    h.get(DEADLINE_HEADER)?.to_str().ok()?.parse().ok()
}

/// Runs `req` on the balancer (one at a time, in arrival order) and
/// answers it.
async fn run(
    st: &Shared,
    h: &HeaderMap,
    req: Result<Request, Response>,
) -> axum::response::Response {
    let resp = match req {
        Err(r) => r,
        Ok(req) => {
            let mut lb = st.lb.lock().await;
            // Checked once the lock is held: the request starts now.
            if past_deadline(deadline(h)) {
                tracing::warn!(
                    "control: a request arrived after its sender's deadline; not applied ({})",
                    req_name(&req)
                );
                Response::error(
                    408,
                    "the request reached the daemon after its deadline; not applied",
                )
            } else {
                let detach = matches!(req, Request::Detach { .. });
                let r = handle(&mut lb, req, &st.state_file);
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
async fn get_vip(State(st): State<St>, Path(vip): Path<String>) -> axum::response::Response {
    let resp = match parse_addr(&vip) {
        Err(r) => r,
        Ok(v) => {
            let lb = st.lb.lock().await;
            let vips: Vec<_> = lb.list_vips().into_iter().filter(|x| x.vip == v).collect();
            if vips.is_empty() {
                Response::error(404, format!("no VIP {v}"))
            } else {
                Response::Vips { vips }
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
        parse_body::<AddBackendsBody>(&b).map(|b| Request::AddBackends {
            vip,
            backends: b.backends,
            weight: b.weight,
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
#[utoipa::path(get, path = "/v1/flows", params(("limit" = Option<usize>, Query, description = "at most this many (default 100, at most 10,000)")), responses((status = 200, body = Response)))]
async fn flows(
    State(st): State<St>,
    Query(q): Query<FlowsQuery>,
    h: HeaderMap,
) -> axum::response::Response {
    run(&st, &h, Ok(Request::Flows { limit: q.limit })).await
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
    });
    run(&st, &h, req).await
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

/// Accepts and serves connections on `listener` until the task is dropped.
pub async fn serve_forever(listener: UnixListener, shared: St, access: Access) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = std::time::Duration::from_millis(10);
    let mut accept_log = RateLimitedLog::default();
    let mut busy_log = RateLimitedLog::default();
    let app = router(shared, access);
    loop {
        let stream = match listener.accept().await {
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
    let who = crate::control::describe_peer(cred.pid(), cred.uid());
    crate::control::CALLER
        .scope(who, serve_io(stream, app))
        .await
}

/// Serves one HTTP/1.1 request on `stream`. A client that sends nothing,
/// or does not read its answer, gives up its slot (reads: REQUEST_TIMEOUT
/// between bytes, and hyper's header timeout; writes: ANSWER_TIMEOUT
/// without progress).
async fn serve_io<S>(stream: S, app: Router) -> anyhow::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_read_timeout(Some(REQUEST_TIMEOUT));
    io.set_write_timeout(Some(ANSWER_TIMEOUT));
    let io = Box::pin(io);
    hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app))
        .await?;
    Ok(())
}

/// `GET /metrics` (and `/`): the Prometheus text exposition.
async fn scrape(State(src): State<Arc<crate::metrics::Source>>) -> axum::response::Response {
    let text = {
        let lb = src.lb.lock().await;
        lb.stats().map(|s| crate::metrics::render(&s, &src.daemon))
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

/// Serves Prometheus scrapes on `listener` until the task is dropped: at
/// most [`MAX_CONNECTIONS`] at once (more are closed at once), the same
/// timeouts as the control socket.
pub async fn serve_metrics(listener: tokio::net::TcpListener, src: Arc<crate::metrics::Source>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut accept_log = RateLimitedLog::default();
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/", get(scrape))
        .with_state(src);
    loop {
        let stream = match listener.accept().await {
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
