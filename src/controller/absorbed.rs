//! OOMs a training process absorbed itself (`vramfit.Step` halved its
//! micro-batch inside the process): the controller records the new shape in the
//! job's status and starts the next job of the same model at it.

use crate::api::{AbsorbedOom, ObservedShape, TrainingJob, TrainingJobSpec, TrainingJobStatus};

use crate::job::backoff::BatchShape;
use crate::job::signature::model_signature;

/// What a process's reported shape changes in its job's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbsorbedUpdate {
    /// The shape the process runs with now.
    pub shape: BatchShape,
    /// The OOMs not recorded in status yet, oldest first.
    pub new: Vec<AbsorbedOom>,
}

/// Compares the shape a job's process reports with the job's status. `None`
/// when nothing new was absorbed, or when the report cannot be the job's (a
/// shape that does not make up the global batch, or a larger micro-batch).
pub fn newly_absorbed(
    spec: &TrainingJobSpec,
    status: &TrainingJobStatus,
    observed: &ObservedShape,
) -> Option<AbsorbedUpdate> {
    let new: Vec<AbsorbedOom> = observed
        .absorbed_ooms
        .iter()
        .filter(|oom| !status.absorbed_ooms.contains(oom))
        .cloned()
        .collect();
    if new.is_empty() {
        return None;
    }
    let shape = BatchShape::for_micro(spec.batch.global, observed.micro_batch, spec.gpus)?;
    let current = status.micro_batch.unwrap_or(spec.batch.micro);
    (shape.accum == observed.grad_accum && shape.micro < current)
        .then_some(AbsorbedUpdate { shape, new })
}

/// The event text of one absorbed OOM.
pub fn absorbed_message(oom: &AbsorbedOom) -> String {
    format!(
        "OOM absorbed in-process: micro {} -> {}, accumulation {} -> {}",
        oom.from_micro, oom.to_micro, oom.from_accum, oom.to_accum
    )
}

/// What other jobs of the same model learn from a job whose process absorbed
/// OOMs: its signature at its starting micro-batch, the smallest micro-batch it
/// backed off to, and its name. `None` for a job that absorbed none.
pub fn absorbed_lesson(job: &TrainingJob) -> Option<(String, u32, String)> {
    // Jobs without absorbed OOMs are passed over before their signature is
    // computed: the signature costs a serialisation.
    let smallest = job
        .status
        .as_ref()?
        .absorbed_ooms
        .iter()
        .map(|o| o.to_micro)
        .min()?;
    Some((
        model_signature(&job.spec, job.spec.batch.micro),
        smallest,
        job.metadata.name.clone().unwrap_or_default(),
    ))
}

/// The micro-batch a new job should start at, learned from other jobs of the
/// same model (the same signature at their starting micro-batch) whose
/// processes absorbed OOMs: the smallest micro-batch they backed off to, when
/// it is valid for this job's global batch and floor. Returns it with the name
/// of the job it was learned from.
pub fn learned_start_micro<'a>(
    spec: &TrainingJobSpec,
    jobs: impl IntoIterator<Item = &'a TrainingJob>,
) -> Option<(u32, String)> {
    let signature = model_signature(spec, spec.batch.micro);
    let learned = jobs
        .into_iter()
        .filter_map(absorbed_lesson)
        .filter(|(s, _, _)| *s == signature)
        .map(|(_, micro, from)| (micro, from))
        .min()?;
    start_micro_below(spec, learned)
}

/// The largest micro-batch valid for `spec` (its global batch, GPUs and floor)
/// that is not above the `learned` one and below the spec's own, with the job
/// it was learned from.
pub fn start_micro_below(spec: &TrainingJobSpec, learned: (u32, String)) -> Option<(u32, String)> {
    let (micro, from) = learned;
    (spec.batch.min_micro.max(1)..=micro.min(spec.batch.micro.saturating_sub(1)))
        .rev()
        .find(|m| BatchShape::for_micro(spec.batch.global, *m, spec.gpus).is_some())
        .map(|m| (m, from))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(global: u32, micro: u32, min_micro: u32, layers: u32) -> TrainingJobSpec {
        serde_json::from_value(json!({
            "batch": {"global": global, "micro": micro, "minMicro": min_micro},
            "model": {"mlp": {"layers": layers, "hidden": 1024}},
            "template": {}
        }))
        .unwrap()
    }

    fn oom(from: u32, to: u32, from_accum: u32, to_accum: u32, time: &str) -> AbsorbedOom {
        AbsorbedOom {
            from_micro: from,
            to_micro: to,
            from_accum,
            to_accum,
            time: time.into(),
        }
    }

    fn observed(micro: u32, accum: u32, ooms: Vec<AbsorbedOom>) -> ObservedShape {
        ObservedShape {
            micro_batch: micro,
            grad_accum: accum,
            absorbed_ooms: ooms,
        }
    }

    fn job(name: &str, spec: TrainingJobSpec, absorbed: Vec<AbsorbedOom>) -> TrainingJob {
        let mut job = TrainingJob::new(name, spec);
        job.status = Some(TrainingJobStatus {
            absorbed_ooms: absorbed,
            ..TrainingJobStatus::default()
        });
        job
    }

    #[test]
    fn a_new_absorbed_oom_changes_the_shape_once() {
        let s = spec(64, 16, 1, 4);
        let mut status = TrainingJobStatus {
            micro_batch: Some(16),
            grad_accum: Some(4),
            ..TrainingJobStatus::default()
        };
        let first = oom(16, 8, 4, 8, "t1");
        let update = newly_absorbed(&s, &status, &observed(8, 8, vec![first.clone()])).unwrap();
        assert_eq!(update.shape, BatchShape { micro: 8, accum: 8 });
        assert_eq!(update.new, std::slice::from_ref(&first));
        assert_eq!(
            absorbed_message(&update.new[0]),
            "OOM absorbed in-process: micro 16 -> 8, accumulation 4 -> 8"
        );
        // Recorded: the same report again changes nothing.
        status.absorbed_ooms.push(first.clone());
        status.micro_batch = Some(8);
        status.grad_accum = Some(8);
        assert_eq!(
            newly_absorbed(&s, &status, &observed(8, 8, vec![first.clone()])),
            None
        );
        // A second one is new.
        let second = oom(8, 4, 8, 16, "t2");
        let update = newly_absorbed(&s, &status, &observed(4, 16, vec![first, second.clone()]));
        assert_eq!(update.unwrap().new, [second]);
    }

    /// A 64 / 16 job at micro-batch 8 in status, and a report of one OOM
    /// absorbed from 16 to 8.
    fn at_micro_8_after_one_oom() -> (TrainingJobSpec, TrainingJobStatus, Vec<AbsorbedOom>) {
        let status = TrainingJobStatus {
            micro_batch: Some(8),
            ..TrainingJobStatus::default()
        };
        (spec(64, 16, 1, 4), status, vec![oom(16, 8, 4, 8, "t")])
    }

    #[test]
    fn a_report_that_cannot_be_the_jobs_is_ignored() {
        let (s, status, o) = at_micro_8_after_one_oom();
        // 6 does not divide 64; 8x4 is not the global batch; 16 is not smaller.
        assert_eq!(
            newly_absorbed(&s, &status, &observed(6, 10, o.clone())),
            None
        );
        assert_eq!(
            newly_absorbed(&s, &status, &observed(8, 4, o.clone())),
            None
        );
        assert_eq!(newly_absorbed(&s, &status, &observed(16, 4, o)), None);
        // No absorbed OOM: nothing to record.
        assert_eq!(newly_absorbed(&s, &status, &observed(4, 16, vec![])), None);
    }

    #[test]
    fn the_next_job_of_the_same_model_starts_where_the_last_one_backed_off_to() {
        let this = spec(64, 16, 1, 4);
        let jobs = [
            job("same", spec(64, 16, 1, 4), vec![oom(16, 8, 4, 8, "t")]),
            job(
                "other-model",
                spec(64, 16, 1, 6),
                vec![oom(16, 2, 4, 32, "t")],
            ),
            job(
                "other-start",
                spec(64, 32, 1, 4),
                vec![oom(32, 4, 2, 16, "t")],
            ),
            job("nothing-absorbed", spec(64, 16, 1, 4), vec![]),
        ];
        assert_eq!(learned_start_micro(&this, &jobs), Some((8, "same".into())));
        let g48 = spec(48, 16, 1, 4);
        assert_eq!(learned_start_micro(&g48, &jobs), Some((8, "same".into())));
        // Another global batch of the same model takes the largest valid
        // micro-batch not above the learned one: 4 does not divide 18, 3 does.
        let nine = [job("nine", spec(36, 9, 1, 4), vec![oom(9, 4, 4, 9, "t")])];
        assert_eq!(
            learned_start_micro(&spec(18, 9, 1, 4), &nine),
            Some((3, "nine".into()))
        );
        // The floor wins over what was learned.
        assert_eq!(learned_start_micro(&spec(64, 16, 16, 4), &jobs), None);
        assert_eq!(learned_start_micro(&this, &jobs[1..]), None);
    }

    #[test]
    fn a_report_at_the_micro_batch_in_status_records_nothing() {
        // Only a smaller micro-batch than the status's is an absorbed OOM;
        // the same one again (with an OOM status does not list) is not.
        let (s, status, o) = at_micro_8_after_one_oom();
        assert_eq!(
            newly_absorbed(&s, &status, &observed(8, 8, o.clone())),
            None
        );
        assert!(newly_absorbed(&s, &status, &observed(4, 16, o)).is_some());
    }
}
