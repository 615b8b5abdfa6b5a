//! Following a watch in a background task: shared by the integration tests
//! and the scale benchmark (`#[path]`-included there).

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

/// Hands every object a watch of `api` applies to `observe`, until aborted.
pub fn follow<K>(
    api: Api<K>,
    mut observe: impl FnMut(&K) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(object) = event {
                observe(&object);
            }
        }
    })
}
