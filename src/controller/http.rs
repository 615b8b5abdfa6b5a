//! The controller's HTTP server: Prometheus metrics, health, and the `/ui`
//! page (the same view as `vramfit status`).

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

pub(super) async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ui: UiSource,
) -> Result<()> {
    use axum::http::{StatusCode, header};
    use axum::response::{IntoResponse, Redirect};
    use axum::{Router, routing::get};
    let page_source = ui.clone();
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move { m.encode() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/", get(|| async { Redirect::temporary("/ui") }))
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
        );
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    axum::serve(listener, app)
        .await
        .map_err(|source| Error::Io {
            path: format!("metrics server on {addr}"),
            source,
        })
}
