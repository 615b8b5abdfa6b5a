//! What a prediction reads from every other job: the highest peak measured
//! for its model, and the micro-batch other jobs of its model backed off to.
//! Kept up to date from the job watch's events, so that a prediction looks up
//! its model instead of scanning the whole job cache (which made a burst of
//! new jobs quadratic in the jobs cached).

use std::collections::HashMap;
use std::sync::Mutex;

use kube::runtime::watcher::Event;

use crate::api::{Phase, TrainingJob};

use super::absorbed::absorbed_lesson;
use super::cluster_view::job_key;

/// A finished job's measured peak with its model signature: what the next job
/// of the same signature is budgeted on. `None` unless the job succeeded with
/// a measured peak.
pub fn measured_lesson(job: &TrainingJob) -> Option<(String, u64)> {
    let status = job.status.as_ref()?;
    if status.phase != Phase::Succeeded {
        return None;
    }
    Some((status.model_signature.clone()?, status.measured_peak_bytes?))
}

/// The lessons of the jobs in the job cache, by model signature.
#[derive(Default)]
pub struct JobIndex(Mutex<Indexed>);

#[derive(Default)]
struct Indexed {
    live: Lessons,
    /// A relist under way: its jobs, swapped in when it completes (as the
    /// reflector's store does).
    relist: Option<Lessons>,
}

#[derive(Default)]
struct Lessons {
    by_job: HashMap<String, Lesson>,
    /// Signature -> job -> measured peak.
    peaks: HashMap<String, HashMap<String, u64>>,
    /// Signature -> job -> (smallest micro-batch backed off to, job name).
    backoffs: HashMap<String, HashMap<String, (u32, String)>>,
}

#[derive(Default)]
struct Lesson {
    peak: Option<(String, u64)>,
    backoff: Option<(String, u32, String)>,
}

/// The key of a job in the index: its uid, else its ledger key.
fn job_id(job: &TrainingJob) -> String {
    job.metadata.uid.clone().unwrap_or_else(|| job_key(job))
}

impl Lessons {
    fn remove(&mut self, id: &str) {
        let Some(old) = self.by_job.remove(id) else {
            return;
        };
        if let Some((signature, _)) = old.peak {
            remove_from(&mut self.peaks, &signature, id);
        }
        if let Some((signature, _, _)) = old.backoff {
            remove_from(&mut self.backoffs, &signature, id);
        }
    }

    fn insert(&mut self, job: &TrainingJob) {
        let id = job_id(job);
        self.remove(&id);
        let lesson = Lesson {
            peak: measured_lesson(job),
            backoff: absorbed_lesson(job),
        };
        if let Some((signature, peak)) = &lesson.peak {
            self.peaks
                .entry(signature.clone())
                .or_default()
                .insert(id.clone(), *peak);
        }
        if let Some((signature, micro, name)) = &lesson.backoff {
            self.backoffs
                .entry(signature.clone())
                .or_default()
                .insert(id.clone(), (*micro, name.clone()));
        }
        if lesson.peak.is_some() || lesson.backoff.is_some() {
            self.by_job.insert(id, lesson);
        }
    }
}

fn remove_from<V>(map: &mut HashMap<String, HashMap<String, V>>, signature: &str, id: &str) {
    if let Some(jobs) = map.get_mut(signature) {
        jobs.remove(id);
        if jobs.is_empty() {
            map.remove(signature);
        }
    }
}

impl JobIndex {
    /// Follows one event of the job watch (after the reflector stored it).
    pub fn observe(&self, event: &Event<TrainingJob>) {
        let mut indexed = self.0.lock().expect("job index lock");
        match event {
            Event::Apply(job) => indexed.live.insert(job),
            Event::Delete(job) => indexed.live.remove(&job_id(job)),
            Event::Init => indexed.relist = Some(Lessons::default()),
            Event::InitApply(job) => indexed.relist.get_or_insert_default().insert(job),
            Event::InitDone => {
                if let Some(relist) = indexed.relist.take() {
                    indexed.live = relist;
                }
            }
        }
    }

    /// The highest peak measured by a succeeded job with this model signature.
    pub fn measured_peak_for(&self, signature: &str) -> Option<u64> {
        let indexed = self.0.lock().expect("job index lock");
        indexed.live.peaks.get(signature)?.values().max().copied()
    }

    /// The smallest micro-batch a job with this signature (at its starting
    /// micro-batch) backed off to in-process, with that job's name (the first
    /// name on a tie).
    pub fn smallest_backoff(&self, signature: &str) -> Option<(u32, String)> {
        let indexed = self.0.lock().expect("job index lock");
        indexed
            .live
            .backoffs
            .get(signature)?
            .values()
            .min()
            .cloned()
    }
}

#[cfg(test)]
#[path = "job_index_tests.rs"]
mod tests;
