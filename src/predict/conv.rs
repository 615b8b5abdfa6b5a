//! cuDNN's convolution workspaces.
//!
//! A convolution on a CUDA GPU takes a workspace from PyTorch's caching
//! allocator for the duration of the call (`run_conv_plan`) and gives it back
//! after the kernel: one for the forward, and in backward one for the input's
//! gradient and one for the weight's, each right after that gradient is
//! allocated. A CPU capture cannot see them (it has no cuDNN), so it writes
//! every convolution call with its shape (`convolutions` in the profile,
//! docs/profile-format.md) and [`cudnn_workspace`] sizes it.
//!
//! The sizes follow what cuDNN 9.19 picks by its heuristics (PyTorch 2.11's
//! default, `cudnn.benchmark` off) on the H200, measured one convolution at a
//! time for the convolutions of fifteen torchvision models and a random grid
//! (1,264 shapes, `scripts/gpu/conv_workspaces.py`, raw in
//! data/calibration/h200-conv-workspaces/), and in whole training runs with
//! the allocations' C++ stacks (data/calibration/h200-origins/):
//!
//! - a depthwise convolution of a channels-last input (ConvNeXt's blocks
//!   hand theirs over permuted) goes to cuDNN, whose weight-gradient kernel
//!   keeps per-tile partial sums: 8.2-8.4 times the input for inputs of tens
//!   of MiB (ConvNeXt-S's first two stages in fp32), under the input for
//!   small ones. This one is modelled;
//! - a depthwise convolution of a contiguous input runs ATen's own kernel:
//!   none;
//! - a dense convolution with a spatial kernel or a stride on NCHW tensors
//!   takes the input, the output and the filter transposed (to the byte in
//!   most shapes), a 1x1 of stride 1 none that matters, a channels-last one
//!   none. These are measured but not modelled: replayed after the CPU
//!   capture's sequence they lower the predicted peak of VGG and ResNet
//!   runs (VGG-16-BN -8.4 % -> -9.7 %, ResNet-18 -10.0 % -> -19.4 %), which
//!   says the capture's sequence around them differs from the GPU's in a
//!   way not yet found (docs/benchmarks/library-models.md).
//!
//! The same rule is applied to every GPU; only the H200 was measured.

use serde::Deserialize;

/// Which of a convolution's three calls.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ConvPass {
    /// The forward.
    Forward,
    /// The input's gradient.
    Input,
    /// The weight's gradient.
    Weight,
}

/// One convolution call as the capture saw it (the tensors' shapes are the
/// forward's: input N x C x H x W, weight K x C/groups x R x S).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConvCall {
    /// Position in the profile's events before which the workspace is
    /// taken and given back.
    pub at: usize,
    /// Which call.
    pub kind: ConvPass,
    /// Input shape.
    pub input: Vec<u64>,
    /// Weight shape.
    pub weight: Vec<u64>,
    /// Stride per spatial dimension.
    pub stride: Vec<u64>,
    /// Padding per spatial dimension.
    pub padding: Vec<u64>,
    /// Dilation per spatial dimension.
    pub dilation: Vec<u64>,
    /// Groups.
    pub groups: u64,
    /// A transposed convolution.
    #[serde(default)]
    pub transposed: bool,
    /// The input's dtype (`float32`, `bfloat16`, `float16`, ...).
    pub dtype: String,
    /// The input is laid out channels-last.
    #[serde(default)]
    pub channels_last: bool,
}

/// Inputs of at least this many bytes take the large partial-sum buffer in
/// a channels-last depthwise weight gradient (between ConvNeXt-S's second
/// stage, 27.6 MiB, and its third, 13.8 MiB).
const DEPTHWISE_LARGE_INPUT: u64 = 16 << 20;

/// The workspace cuDNN takes for one call, in bytes (0: none, or none
/// modelled: see the module's description).
pub fn cudnn_workspace(call: &ConvCall) -> u64 {
    let Some(elem) = dtype_bytes(&call.dtype) else {
        return 0;
    };
    // 2-D convolutions only; 1-D and 3-D ones are left at none.
    if call.input.len() != 4 || call.weight.len() != 4 || call.transposed {
        return 0;
    }
    let depthwise = call.groups > 1 && call.groups == call.input[1] && call.weight[1] == 1;
    if !(depthwise && call.channels_last && call.kind == ConvPass::Weight) {
        return 0;
    }
    let input = call.input.iter().product::<u64>() * elem;
    if input >= DEPTHWISE_LARGE_INPUT {
        input * 84 / 10
    } else {
        input * 6 / 10
    }
}

fn dtype_bytes(dtype: &str) -> Option<u64> {
    match dtype {
        "float32" => Some(4),
        "bfloat16" | "float16" => Some(2),
        _ => None,
    }
}

#[cfg(test)]
#[path = "conv_tests.rs"]
mod tests;
