//! Leader election over a Lease, with the fence the writes check
//! ([`super::fence`]).

use std::sync::Arc;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::*;
use crate::{Error, Result};

/// Waits until this replica holds the Lease. Returns the lease manager's task,
/// a receiver of its channel (dropping the last one releases the Lease), the
/// fence the writes check, and a future that ends with
/// `Error::LeadershipLost` when another replica takes the Lease, when the
/// Lease expires before this replica is seen renewing it (the API server away
/// longer than the Lease, or this process paused past it), or when the lease
/// manager stops: the controller then stops acting at once and the process
/// exits, to campaign again as a standby when restarted.
pub(super) async fn acquire_leadership(
    client: Client,
    lease: &LeaseOptions,
) -> Result<(
    impl std::future::Future<Output = Result<()>> + Send + 'static,
    tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    tokio::sync::watch::Receiver<bool>,
    Arc<fence::Fence>,
)> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube_lease_manager::LeaseManagerBuilder;
    let manager = LeaseManagerBuilder::new(client.clone(), &lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await
        .map_err(|e| Error::Leadership(e.to_string()))?;
    let (mut channel, manager_task) = manager.watch().await;
    tracing::info!(lease = %lease.name, identity = %lease.identity, "waiting for leadership");
    while !*channel.borrow_and_update() {
        if channel.changed().await.is_err() {
            return Err(Error::Leadership("lease manager stopped".into()));
        }
    }
    // The fence opens until the expiry of the Lease as this replica took it.
    let leases: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let taken = leases
        .get(&lease.name)
        .await
        .map_err(|e| Error::Leadership(format!("reading Lease {}: {e}", lease.name)))?;
    let until = fence::hold_until(&taken, &lease.identity).ok_or_else(|| {
        Error::Leadership(format!(
            "Lease {} is not held by {} after it was taken",
            lease.name, lease.identity
        ))
    })?;
    let leader_fence = Arc::new(fence::Fence::until(until));
    tracing::info!(lease = %lease.name, "became leader");
    // Held by the caller until it decides whether the Lease is released (the
    // manager releases it once every receiver is gone).
    let kept = channel.clone();
    let (name, identity, fence) = (
        lease.name.clone(),
        lease.identity.clone(),
        leader_fence.clone(),
    );
    let lost = async move {
        // Each renewal shows in the Lease's watch and moves the fence on.
        let renewals = watcher(
            leases,
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff()
        .applied_objects();
        let mut renewals = std::pin::pin!(renewals);
        loop {
            let left = fence
                .deadline()
                .and_then(|d| d.duration_since(std::time::SystemTime::now()).ok())
                .unwrap_or_default();
            tokio::select! {
                changed = channel.changed() => {
                    if changed.is_err() {
                        fence.lose();
                        return Err(Error::LeadershipLost(format!(
                            "the manager of Lease {name} stopped"
                        )));
                    }
                    if !*channel.borrow_and_update() {
                        fence.lose();
                        return Err(Error::LeadershipLost(format!(
                            "Lease {name} is held by another replica or could not be renewed"
                        )));
                    }
                }
                seen = renewals.next() => match seen {
                    Some(Ok(seen)) => match fence::hold_until(&seen, &identity) {
                        Some(until) => fence.renewed(until),
                        None => {
                            fence.lose();
                            let holder = seen.spec.and_then(|s| s.holder_identity);
                            return Err(Error::LeadershipLost(format!(
                                "Lease {name} is held by {}",
                                holder.as_deref().unwrap_or("nobody")
                            )));
                        }
                    },
                    // The watch retries by itself.
                    Some(Err(error)) => tracing::debug!(%error, "Lease watch"),
                    None => {
                        fence.lose();
                        return Err(Error::LeadershipLost(format!("the watch of Lease {name} ended")));
                    }
                },
                // The deadline passed, or a write found the fence closed.
                () = async {
                    tokio::select! {
                        () = tokio::time::sleep(left) => {}
                        () = fence.closed() => {}
                    }
                } => {
                    if fence.check().is_err() {
                        return Err(Error::LeadershipLost(format!(
                            "Lease {name} expired before this replica was seen renewing it"
                        )));
                    }
                }
            }
        }
    };
    Ok((lost, manager_task, kept, leader_fence))
}
