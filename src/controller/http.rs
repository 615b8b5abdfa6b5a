//! The controller's HTTP server: Prometheus metrics, health, and the `/ui`
//! page (the same view as `vramfit status`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::runtime::reflector::Store;

use crate::api::{GpuNode, TrainingJob};
use crate::status::ClusterStatus;

use super::*;
use crate::{Error, Result};
use metrics::Metrics;

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
            client,
            namespace: options.namespace.clone(),
            node_selector: options.node_selector.clone(),
            heartbeat_ttl: options.heartbeat_ttl,
            caches: Arc::default(),
            last: Arc::default(),
        }
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
    use axum::http::{StatusCode, header};
    use axum::response::{IntoResponse, Redirect};
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
            get(move || {
                let source = page_source.clone();
                async move {
                    match source.view().await {
                        Ok(view) => (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                            crate::status::html::render(&view, UI_REFRESH_SECONDS),
                        )
                            .into_response(),
                        Err(message) => (
                            StatusCode::BAD_GATEWAY,
                            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                            crate::status::html::error_page(&message, UI_REFRESH_SECONDS),
                        )
                            .into_response(),
                    }
                }
            }),
        )
        .route(
            "/ui/status.json",
            get(move || {
                let source = ui.clone();
                async move {
                    match source.view().await {
                        Ok(view) => axum::Json(view).into_response(),
                        Err(message) => (StatusCode::BAD_GATEWAY, message).into_response(),
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
