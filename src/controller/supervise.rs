//! Supervision of the controller's background tasks (the scheduling loop, the
//! Node watch, the metrics server, the Lease): each runs for the life of the
//! process, so one that ends, fails or panics ends the process with its name
//! and reason instead of leaving placement stopped while the rest looks alive.

use std::future::Future;

use futures::future::select_all;
use tokio::task::JoinHandle;

use crate::{Error, Result};

/// Named tasks that must run as long as the controller; aborted on drop.
#[derive(Default)]
pub struct Supervisor {
    tasks: Vec<(&'static str, JoinHandle<Result<()>>)>,
}

impl Supervisor {
    /// Spawns `task` under `name`.
    pub fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = Result<()>> + Send + 'static,
    ) {
        self.tasks.push((name, tokio::spawn(task)));
    }

    /// Waits until the first task ends and says which one and why. Pending
    /// forever without tasks.
    pub async fn first_exit(&mut self) -> Error {
        if self.tasks.is_empty() {
            return std::future::pending().await;
        }
        let handles = self.tasks.iter_mut().map(|(_, handle)| handle);
        let (result, index, _) = select_all(handles).await;
        let (task, _) = self.tasks.remove(index);
        match result {
            Ok(Err(error)) => match error {
                // Already says what happened.
                Error::LeadershipLost(_) => error,
                error => Error::TaskStopped {
                    task,
                    reason: error.to_string(),
                },
            },
            Ok(Ok(())) => Error::TaskStopped {
                task,
                reason: "it ended".into(),
            },
            Err(join) => Error::TaskStopped {
                task,
                reason: if join.is_panic() {
                    format!("it panicked: {}", panic_text(join.into_panic()))
                } else {
                    "it was cancelled".into()
                },
            },
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        for (_, handle) in &self.tasks {
            handle.abort();
        }
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
#[path = "supervise_tests.rs"]
mod tests;
