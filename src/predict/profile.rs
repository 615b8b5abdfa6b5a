//! Allocation profiles (`vramfit.profile/v1`, docs/profile-format.md): a
//! recorded sequence of a training run's tensor allocations and frees, replayed
//! through the allocator model instead of the analytic event generator.

use serde::Deserialize;

use super::PredictError;
use super::conv::{ConvCall, cudnn_workspace};
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
/// be derived from it and is refused. `cublas_workspace` bytes are allocated
/// at each of the profile's `cublasWorkspaceAt` positions, and each of its
/// `convolutions` takes and gives back its cuDNN workspace at its position.
pub fn profile_events(
    p: &Profile,
    micro_batch: u32,
    cublas_workspace: u64,
) -> Result<Vec<TensorEvent>, PredictError> {
    if micro_batch > p.micro_batch {
        return Err(PredictError::Unsupported(format!(
            "profile was recorded at micro-batch {} and cannot predict the larger micro-batch {micro_batch}",
            p.micro_batch
        )));
    }
    if let Some(bad) = p
        .cublas_workspace_at
        .iter()
        .find(|&&at| at > p.events.len())
    {
        return Err(PredictError::Invalid(format!(
            "profile.cublasWorkspaceAt names position {bad}, but events has {}",
            p.events.len()
        )));
    }
    if let Some(bad) = p.convolutions.iter().find(|c| c.at > p.events.len()) {
        return Err(PredictError::Invalid(format!(
            "profile.convolutions names position {}, but events has {}",
            bad.at,
            p.events.len()
        )));
    }
    let mut out =
        Vec::with_capacity(p.events.len() + p.cublas_workspace_at.len() + 2 * p.convolutions.len());
    let mut live = Vec::<bool>::new();
    // Workspace ids come after every id of the profile.
    let mut next_ws = p.events.iter().filter(|&&e| e >= 0).count() as u32;
    let workspaces_before = |pos: usize, out: &mut Vec<TensorEvent>, next_ws: &mut u32| {
        for _ in p.cublas_workspace_at.iter().filter(|&&at| at == pos) {
            out.push(TensorEvent::Alloc {
                id: *next_ws,
                bytes: cublas_workspace,
                category: Category::Workspace,
                stream: Stream::Default,
            });
            *next_ws += 1;
        }
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
        workspaces_before(pos, &mut out, &mut next_ws);
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
    workspaces_before(p.events.len(), &mut out, &mut next_ws);
    Ok(out)
}
