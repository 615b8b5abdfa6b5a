//! The controller's HTTP server: Prometheus metrics, health, and the `/ui`
//! page (the same view as `vramfit status`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;

use super::*;
use crate::{Error, Result};
use metrics::Metrics;

/// What the `/ui` page reads: the same objects as `vramfit status`, listed
/// on each request (a standby replica serves the page too).
#[derive(Clone)]
pub(super) struct UiSource {
    pub(super) client: Client,
    pub(super) namespace: Option<String>,
    pub(super) node_selector: Option<String>,
    pub(super) heartbeat_ttl: Duration,
}

/// Seconds between the page's reloads.
const UI_REFRESH_SECONDS: u32 = 5;

impl UiSource {
    async fn view(&self) -> std::result::Result<crate::status::ClusterStatus, String> {
        let (jobs, gpu_nodes) = crate::status::fetch(
            &self.client,
            self.namespace.as_deref(),
            self.node_selector.as_deref(),
        )
        .await
        .map_err(|e| format!("listing TrainingJobs and GpuNodes: {e}"))?;
        let ttl =
            SignedDuration::try_from(self.heartbeat_ttl).unwrap_or(SignedDuration::from_secs(120));
        Ok(crate::status::cluster_status(
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
