//! Allocation profiles (`vramfit.profile/v1`, docs/profile-format.md): a
//! recorded sequence of a training run's tensor allocations and frees, replayed
//! through the allocator model instead of the analytic event generator.

use serde::Deserialize;

use super::PredictError;
use super::conv::{ConvCall, cudnn_workspace};
use super::gpu::GpuProfile;
use super::reduce::column_sum_staging;
use super::sequence::{Category, Stream, TensorEvent};

/// The only format version understood.
pub const PROFILE_FORMAT: &str = "vramfit.profile/v1";

/// A parsed profile.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// Must be [`PROFILE_FORMAT`].
    pub format: String,
    /// Micro-batch per GPU the profile was recorded at.
    pub micro_batch: u32,
    /// Gradient accumulation it was recorded with.
    #[serde(default = "one")]
    pub grad_accum: u32,
    /// Distinct request sizes in bytes.
    pub sizes: Vec<u64>,
    /// `k >= 0`: allocate `sizes[k]` (ids count allocations from 0);
    /// `k < 0`: free the allocation with id `-k - 1`.
    pub events: Vec<i64>,
    /// Free-form note on where the profile came from.
    #[serde(default)]
    pub source: Option<String>,
    /// Positions in `events` before which a cuBLAS workspace of the GPU's size
    /// is allocated (kept to the end). Written by captures that could not see
    /// the workspaces (`python -m vramfit.profile`); absent in profiles
    /// converted from a CUDA snapshot, whose events hold them.
    #[serde(default)]
    pub cublas_workspace_at: Vec<usize>,
    /// Convolution calls, each with the position in `events` before which
    /// its cuDNN workspace is taken and given back (sized by
    /// [`cudnn_workspace`]). Written by the CPU capture, which has no cuDNN.
    #[serde(default)]
    pub convolutions: Vec<ConvCall>,
    /// Sums of contiguous rows to a vector (a bias's gradient over the
    /// tokens), each with the position in `events` before which ATen's
    /// reduction kernel takes and gives back its staging buffers (sized for
    /// the GPU by [`column_sum_staging`]). Written by the CPU capture.
    #[serde(default)]
    pub reductions: Vec<ColumnSum>,
}

/// A column sum as the CPU capture saw it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct ColumnSum {
    /// Position in the profile's events before which the kernel runs.
    pub at: usize,
    /// Rows summed.
    pub rows: u64,
    /// Contiguous outputs.
    pub outputs: u64,
}

fn one() -> u32 {
    1
}

/// Parses and checks a profile's text.
pub fn parse_profile(text: &str) -> Result<Profile, PredictError> {
    let p: Profile =
        serde_json::from_str(text).map_err(|e| PredictError::Parse(format!("profile: {e}")))?;
    if p.format != PROFILE_FORMAT {
        return Err(PredictError::Unsupported(format!(
            "profile format '{}' is not supported (supported: {PROFILE_FORMAT})",
            p.format
        )));
    }
    if p.micro_batch == 0 {
        return Err(PredictError::Invalid(
            "profile.microBatch must be at least 1".into(),
        ));
    }
    if p.events.is_empty() {
        return Err(PredictError::Invalid("profile.events is empty".into()));
    }
    Ok(p)
}

/// The profile's events, checked: every size index exists, every free names a
/// live allocation. A profile recorded at micro-batch m bounds any smaller
/// micro-batch from above, so it is used as is for those; a larger one cannot
/// be derived from it and is refused. `gpu`'s cuBLAS workspace is allocated
/// at each of the profile's `cublasWorkspaceAt` positions, each of its
/// `convolutions` takes and gives back its cuDNN workspace at its position,
/// and each of its `reductions` the reduction kernel's staging on `gpu`.
pub fn profile_events(
    p: &Profile,
    micro_batch: u32,
    gpu: &GpuProfile,
) -> Result<Vec<TensorEvent>, PredictError> {
    if micro_batch > p.micro_batch {
        return Err(PredictError::Unsupported(format!(
            "profile was recorded at micro-batch {} and cannot predict the larger micro-batch {micro_batch}",
            p.micro_batch
        )));
    }
    let last = [
        (
            "cublasWorkspaceAt",
            p.cublas_workspace_at.iter().copied().max(),
        ),
        ("convolutions", p.convolutions.iter().map(|c| c.at).max()),
        ("reductions", p.reductions.iter().map(|r| r.at).max()),
    ];
    for (field, at) in last {
        if let Some(at) = at.filter(|&at| at > p.events.len()) {
            return Err(PredictError::Invalid(format!(
                "profile.{field} names position {at}, but events has {}",
                p.events.len()
            )));
        }
    }
    let mut out = Vec::with_capacity(
        p.events.len()
            + p.cublas_workspace_at.len()
            + 2 * p.convolutions.len()
            + 4 * p.reductions.len(),
    );
    let mut live = Vec::<bool>::new();
    // Workspace ids come after every id of the profile.
    let mut next_ws = p.events.iter().filter(|&&e| e >= 0).count() as u32;
    // cuBLAS takes its workspace when the call runs, once ATen has allocated
    // the call's output: the capture names the position before that output,
    // so the workspace follows the next allocation (the H200's recorded runs
    // show the head's weight gradient, then the backward workspace).
    let cublas = |out: &mut Vec<TensorEvent>, next_ws: &mut u32, pending: &mut usize| {
        for _ in 0..std::mem::take(pending) {
            out.push(TensorEvent::Alloc {
                id: *next_ws,
                bytes: gpu.cublas_workspace_bytes,
                category: Category::Workspace,
                stream: Stream::Default,
            });
            *next_ws += 1;
        }
    };
    let mut pending = 0;
    let workspaces_before =
        |pos: usize, out: &mut Vec<TensorEvent>, next_ws: &mut u32, pending: &mut usize| {
            *pending += p
                .cublas_workspace_at
                .iter()
                .filter(|&&at| at == pos)
                .count();
            // A convolution's workspace lives only for its call.
            for call in p.convolutions.iter().filter(|c| c.at == pos) {
                // (a call without one takes 0 bytes, which the replay ignores)
                out.push(TensorEvent::Alloc {
                    id: *next_ws,
                    bytes: cudnn_workspace(call),
                    category: Category::Workspace,
                    stream: Stream::Default,
                });
                out.push(TensorEvent::Free { id: *next_ws });
                *next_ws += 1;
            }
            // The reduction kernel's partial sums and semaphores, given back
            // after it (the semaphores first).
            for sum in p.reductions.iter().filter(|r| r.at == pos) {
                let Some(staging) = column_sum_staging(sum.outputs, sum.rows, 4, gpu.reduce) else {
                    continue;
                };
                for bytes in [staging.buffer, staging.semaphores] {
                    out.push(TensorEvent::Alloc {
                        id: *next_ws,
                        bytes,
                        category: Category::Activations,
                        stream: Stream::Default,
                    });
                    *next_ws += 1;
                }
                out.push(TensorEvent::Free { id: *next_ws - 1 });
                out.push(TensorEvent::Free { id: *next_ws - 2 });
            }
        };
    // Allocations the profile never frees outlive the step: weights,
    // gradients, optimizer state. The others are the step's transients.
    let allocs = p.events.iter().filter(|&&e| e >= 0).count();
    let mut freed = vec![false; allocs];
    for &e in p.events.iter().filter(|&&e| e < 0) {
        if let Some(f) = freed.get_mut((-(e + 1)) as usize) {
            *f = true;
        }
    }
    for (pos, &e) in p.events.iter().enumerate() {
        workspaces_before(pos, &mut out, &mut next_ws, &mut pending);
        if e >= 0 {
            let bytes = *p.sizes.get(e as usize).ok_or_else(|| {
                PredictError::Invalid(format!(
                    "profile.events[{pos}] names size {e}, but sizes has {}",
                    p.sizes.len()
                ))
            })?;
            let id = live.len() as u32;
            live.push(true);
            out.push(TensorEvent::Alloc {
                id,
                bytes,
                category: if freed[id as usize] {
                    Category::Activations
                } else {
                    Category::Persistent
                },
                stream: Stream::Default,
            });
            cublas(&mut out, &mut next_ws, &mut pending);
        } else {
            let id = (-(e + 1)) as usize;
            match live.get_mut(id) {
                Some(l) if *l => *l = false,
                _ => {
                    return Err(PredictError::Invalid(format!(
                        "profile.events[{pos}] frees allocation {id}, which is not live"
                    )));
                }
            }
            out.push(TensorEvent::Free { id: id as u32 });
        }
    }
    workspaces_before(p.events.len(), &mut out, &mut next_ws, &mut pending);
    cublas(&mut out, &mut next_ws, &mut pending);
    Ok(out)
}
