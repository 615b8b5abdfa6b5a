//! The controller's HTTP server: Prometheus metrics, health, and the `/ui`
//! page (the same view as `vramfit status`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::runtime::reflector::Store;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::{GpuNode, TrainingJob};
use crate::status::ClusterStatus;
use crate::status::access::{Access, restrict};

use super::*;
use crate::{Error, Result};
use metrics::Metrics;
use ui_auth::{Denial, Reviewer};

/// A `/ui` request not served, and why.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
}

impl From<Denial> for Refusal {
    fn from(denial: Denial) -> Self {
        let (status, message) = match denial {
            Denial::Unauthenticated(m) => (StatusCode::UNAUTHORIZED, m),
            Denial::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            Denial::Busy => (
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests are waiting for the API server's reviews; try again".into(),
            ),
            Denial::Api(m) => (StatusCode::BAD_GATEWAY, m),
        };
        Refusal { status, message }
    }
}

impl Refusal {
    /// The refusal as a response: a 401 says how to authenticate.
    fn respond(self, body: impl IntoResponse) -> Response {
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"vramfit\""),
            );
        }
        response
    }
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// What the `/ui` page reads: the same objects as `vramfit status`. The
/// leader reads them from its watch caches once they exist; a standby (which
/// runs no watch) lists them. Either way the view is computed at most once
/// per [`UI_MIN_INTERVAL`] and shared by every request in between, so however
/// many browsers reload the page, it costs the API server at most two LISTs
/// per interval per replica.
#[derive(Clone)]
pub(super) struct UiSource {
    pub(super) client: Client,
    pub(super) namespace: Option<String>,
    pub(super) node_selector: Option<String>,
    pub(super) heartbeat_ttl: Duration,
    /// The leader's watch caches of TrainingJobs and GpuNodes, set once
    /// they are made.
    pub(super) caches: Arc<OnceLock<(Store<TrainingJob>, Store<GpuNode>)>>,
    pub(super) last: Arc<ViewCache>,
    /// Reviews each reader's token and access; none: everyone sees all.
    pub(super) auth: Option<Arc<Reviewer>>,
}

/// Seconds between the page's reloads.
const UI_REFRESH_SECONDS: u32 = 5;

/// The shortest time between two computations of the `/ui` view.
pub(super) const UI_MIN_INTERVAL: Duration = Duration::from_secs(2);

type View = std::result::Result<ClusterStatus, String>;

/// The last view computed and when; a request within the interval gets it,
/// and requests arriving while one is computed wait for that one.
#[derive(Default)]
pub(super) struct ViewCache {
    last: tokio::sync::Mutex<Option<(Instant, View)>>,
}

impl ViewCache {
    /// The cached view when it is younger than `interval` at `now`, else the
    /// one `compute` makes (then cached).
    pub(super) async fn get<F>(&self, now: Instant, interval: Duration, compute: F) -> View
    where
        F: std::future::Future<Output = View>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, view)) = last.as_ref()
            && now.saturating_duration_since(*at) < interval
        {
            return view.clone();
        }
        let view = compute.await;
        *last = Some((now, view.clone()));
        view
    }
}

impl UiSource {
    pub(super) fn new(client: Client, options: &ControllerOptions) -> Self {
        UiSource {
            client: client.clone(),
            namespace: options.namespace.clone(),
            node_selector: options.node_selector.clone(),
            heartbeat_ttl: options.heartbeat_ttl,
            caches: Arc::default(),
            last: Arc::default(),
            auth: match &options.ui_auth {
                UiAuthMode::None => None,
                UiAuthMode::Kubernetes { audiences } => {
                    Some(Arc::new(Reviewer::new(client.clone(), audiences.clone())))
                }
            },
        }
    }

    /// The view as the bearer of `authorization` (the header's value) may
    /// see it.
    async fn view_for(&self, authorization: Option<&str>) -> Result<ClusterStatus, Refusal> {
        let view = self.view().await.map_err(|message| Refusal {
            status: StatusCode::BAD_GATEWAY,
            message,
        })?;
        let access = match &self.auth {
            None => Access::everything(),
            Some(reviewer) => {
                let namespaces = view.phases_by_namespace.keys().cloned().collect();
                reviewer
                    .authorize(authorization, namespaces)
                    .await
                    .map_err(Refusal::from)?
            }
        };
        Ok(restrict(view, &access))
    }

    async fn view(&self) -> View {
        self.last
            .get(Instant::now(), UI_MIN_INTERVAL, self.compute())
            .await
    }

    async fn compute(&self) -> View {
        let (jobs, gpu_nodes) = match self.caches.get() {
            Some((jobs, gpu_nodes)) => (
                jobs.state().iter().map(|j| (**j).clone()).collect(),
                gpu_nodes.state().iter().map(|n| (**n).clone()).collect(),
            ),
            None => crate::status::fetch(
                &self.client,
                self.namespace.as_deref(),
                self.node_selector.as_deref(),
            )
            .await
            .map_err(|e| format!("listing TrainingJobs and GpuNodes: {e}"))?,
        };
        let ttl =
            SignedDuration::try_from(self.heartbeat_ttl).unwrap_or(SignedDuration::from_secs(120));
        Ok(crate::status::cluster_status::<TrainingJob, GpuNode>(
            &jobs,
            &gpu_nodes,
            Timestamp::now(),
            ttl,
        ))
    }
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pages {
    /// `/metrics` and `/healthz`.
    pub metrics: bool,
    /// `/ui` and `/ui/status.json`.
    pub ui: bool,
}

/// The listeners to open and what each serves: one when both addresses are
/// the same.
pub fn listeners(metrics: Option<SocketAddr>, ui: Option<SocketAddr>) -> Vec<(SocketAddr, Pages)> {
    let mut out: Vec<(SocketAddr, Pages)> = Vec::new();
    if let Some(addr) = metrics {
        out.push((
            addr,
            Pages {
                metrics: true,
                ui: ui == Some(addr),
            },
        ));
    }
    if let Some(addr) = ui.filter(|a| Some(*a) != metrics) {
        out.push((
            addr,
            Pages {
                metrics: false,
                ui: true,
            },
        ));
    }
    out
}

/// The routes of `pages`.
pub(super) fn router(pages: Pages, metrics: Arc<Metrics>, ui: UiSource) -> axum::Router {
    use axum::response::Redirect;
    use axum::{Router, routing::get};
    let mut app = Router::new();
    if pages.metrics {
        app = app
            .route(
                "/metrics",
                get(move || {
                    let m = metrics.clone();
                    async move { m.encode() }
                }),
            )
            .route("/healthz", get(|| async { "ok" }));
    }
    if !pages.ui {
        return app;
    }
    let page_source = ui.clone();
    app.route("/", get(|| async { Redirect::temporary("/ui") }))
        .route(
            "/ui",
            get(move |headers: HeaderMap| {
                let source = page_source.clone();
                async move {
                    let html = [(header::CONTENT_TYPE, "text/html; charset=utf-8")];
                    match source.view_for(authorization(&headers)).await {
                        Ok(view) => (
                            StatusCode::OK,
                            html,
                            crate::status::html::render(&view, UI_REFRESH_SECONDS),
                        )
                            .into_response(),
                        Err(refusal) => {
                            let page = crate::status::html::error_page(
                                &refusal.message,
                                UI_REFRESH_SECONDS,
                            );
                            refusal.respond((html, page))
                        }
                    }
                }
            }),
        )
        .route(
            "/ui/status.json",
            get(move |headers: HeaderMap| {
                let source = ui.clone();
                async move {
                    match source.view_for(authorization(&headers)).await {
                        Ok(view) => axum::Json(view).into_response(),
                        Err(refusal) => {
                            let message = refusal.message.clone();
                            refusal.respond(message)
                        }
                    }
                }
            }),
        )
}

pub(super) async fn serve_metrics(
    listener: tokio::net::TcpListener,
    app: axum::Router,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    axum::serve(listener, app)
        .await
        .map_err(|source| Error::Io {
            path: format!("HTTP server on {addr}"),
            source,
        })
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
