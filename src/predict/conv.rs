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
//! - a 2-D convolution with a spatial kernel or a stride on NCHW tensors runs
//!   an NHWC tensor-core kernel: its workspace holds the input, the output
//!   and the filter transposed, in the call's dtype, in the forward and the
//!   input gradient (to the byte in most shapes). The weight gradient's adds
//!   the kernel's split partial sums: 4 MiB more, the median of the
//!   measured extras (1.6-15.8 MiB from the 10th to the 90th percentile).
//!   That extra matters beyond its size: the weight gradient's workspace no
//!   longer fits the block the input gradient's just gave back, so each
//!   layer's backward makes a segment of its own, as on the GPU;
//! - an image stem (at most 4 input channels) with a kernel of at most 3x3
//!   (VGG's, EfficientNet's, MobileNet's, RegNet's) takes none in fp32, and
//!   none for the forward in half precision; in half precision the
//!   tensor-core kernels take channels in eights, so an image's three are
//!   padded to eight in the transposed input and filter (ResNet's 7x7 stem
//!   in bf16: 1.26 times the fp32 rule);
//! - a 1x1 convolution of stride 1 is a matrix product on NCHW as it lies:
//!   none that matters (the weight gradient's split-K sums, a few filters'
//!   worth, are left out);
//! - a channels-last input is already NHWC: none that matters (ConvNeXt-S's
//!   downsampling convolutions took under 1 MiB);
//! - a depthwise convolution of a contiguous input runs ATen's own kernel:
//!   none; of a channels-last input (ConvNeXt's blocks hand theirs over
//!   permuted) it goes to cuDNN, whose weight-gradient kernel keeps per-tile
//!   partial sums: 8.2-8.4 times the input for inputs of tens of MiB
//!   (ConvNeXt-S's first two stages in fp32), under the input for small
//!   ones;
//! - a depthwise convolution in fp16 (not bf16) of at least 32 channels goes
//!   to cuDNN where ATen's heuristic says it is faster (`use_cudnn_depthwise`);
//!   measured, a 3x3 or 5x5 of stride 1 on maps of at least 28x28 (and a
//!   stride-2 one of at least 256 channels there) then takes the input, the
//!   output and the filter for its weight gradient, as a dense one does
//!   (MobileNet-V2/V3's and EfficientNet-B0's at their calibration batches,
//!   within 0.3 %); smaller maps took none, but for EfficientNet's 5x5 of
//!   1,152 channels on 7x7 (29 MiB) and two the rule gives one that took
//!   none (240 channels 5x5 on 28x28, 1,024 channels at batch 8).
//!
//! The same rule is applied to every GPU; only the H200 was measured.
//!
//! Where a sweep measured the call itself (its shape, batch, dtype and
//! layout: every convolution of 31 torchvision models at batch 8, 16, 24,
//! 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192 and 256 in fp32, bf16 and
//! fp16 on an H100, and fifteen of them at the calibration sets' batches on
//! the H200), the measured workspace is taken
//! instead of the rule ([`measured_text`], written by
//! `scripts/conv_workspace_table.py` from the sweeps' raw output): cuDNN
//! picks its kernels by the whole shape, and the rule misses some of them
//! (in fp32 the forward is the rule's for 49-65 % of the dense shapes), by
//! a few MiB that decide whether a workspace fits a free block.

use std::collections::HashMap;
use std::sync::OnceLock;

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

/// What a dense weight gradient's workspace takes beyond the transposed
/// tensors: the median extra measured on the H200.
pub const WEIGHT_GRADIENT_EXTRA: u64 = 4 << 20;

/// cuDNN's workspaces measured one convolution at a time on the GPU,
/// gzip-compressed tab-separated text with a header line, a line per call:
/// dtype, batch, channels in, height, width, channels out, kernel height and
/// width, stride, padding, dilation, groups, whether the input is
/// channels-last, then the forward's, the input gradient's and the weight
/// gradient's workspace in bytes.
const MEASURED_GZ: &[u8] = include_bytes!("conv_workspaces.tsv.gz");

/// The text of [`MEASURED_GZ`].
pub fn measured_text() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(MEASURED_GZ), &mut text)
            .expect("the measured workspaces are gzip-compressed text");
        text
    })
}

/// A measured call: dtype, then batch, channels in, height, width, channels
/// out, kernel height, kernel width, stride, padding, dilation, groups and
/// channels-last (0/1).
type MeasuredKey = (String, [u64; 12]);

fn measured_table() -> &'static HashMap<MeasuredKey, [u64; 3]> {
    static TABLE: OnceLock<HashMap<MeasuredKey, [u64; 3]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        measured_text()
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut f = line.split('\t');
                let dtype = f.next()?.to_string();
                let v: Vec<u64> = f.map(|x| x.parse().ok()).collect::<Option<_>>()?;
                let key: [u64; 12] = v.get(..12)?.try_into().ok()?;
                let ws: [u64; 3] = v.get(12..15)?.try_into().ok()?;
                Some(((dtype, key), ws))
            })
            .collect()
    })
}

/// The workspace the sweeps measured for exactly this call, if they did.
fn measured_workspace(call: &ConvCall) -> Option<u64> {
    if call.input.len() != 4 || call.weight.len() != 4 || call.transposed {
        return None;
    }
    // square strides, paddings and dilations only
    let square = |v: &[u64], default: u64| match v {
        [] => Some(default),
        [a, rest @ ..] if rest.iter().all(|b| b == a) => Some(*a),
        _ => None,
    };
    let key = [
        call.input[0],
        call.input[1],
        call.input[2],
        call.input[3],
        call.weight[0],
        call.weight[2],
        call.weight[3],
        square(&call.stride, 1)?,
        square(&call.padding, 0)?,
        square(&call.dilation, 1)?,
        call.groups,
        u64::from(call.channels_last),
    ];
    let ws = measured_table().get(&(call.dtype.clone(), key))?;
    Some(match call.kind {
        ConvPass::Forward => ws[0],
        ConvPass::Input => ws[1],
        ConvPass::Weight => ws[2],
    })
}

/// The workspace cuDNN takes for one call, in bytes (0: none): what the
/// sweeps measured for this call, else the rule.
pub fn cudnn_workspace(call: &ConvCall) -> u64 {
    measured_workspace(call).unwrap_or_else(|| workspace_rule(call))
}

/// The rule of the module's notes.
fn workspace_rule(call: &ConvCall) -> u64 {
    let Some(elem) = dtype_bytes(&call.dtype) else {
        return 0;
    };
    // 2-D convolutions only; 1-D and 3-D ones are left at none.
    if call.input.len() != 4 || call.weight.len() != 4 || call.transposed {
        return 0;
    }
    let (n, c, h, w) = (call.input[0], call.input[1], call.input[2], call.input[3]);
    let (k, r, s) = (call.weight[0], call.weight[2], call.weight[3]);
    let depthwise = call.groups > 1 && call.groups == c && call.weight[1] == 1;
    let stride = |i: usize| call.stride.get(i).copied().unwrap_or(1).max(1);
    let out_dim = |size: u64, i: usize, taps: u64| {
        let pad = call.padding.get(i).copied().unwrap_or(0);
        let dil = call.dilation.get(i).copied().unwrap_or(1);
        (size + 2 * pad).saturating_sub(dil * (taps - 1) + 1) / stride(i) + 1
    };
    if depthwise {
        let input = n * c * h * w * elem;
        return match (call.channels_last, call.kind) {
            (true, ConvPass::Weight) if input >= DEPTHWISE_LARGE_INPUT => input * 84 / 10,
            (true, ConvPass::Weight) => input * 6 / 10,
            (false, ConvPass::Weight) if fp16_depthwise_in_cudnn(call) => {
                let output = n * k * out_dim(h, 0, r) * out_dim(w, 1, s) * elem;
                input + output + k * r * s * elem
            }
            _ => 0,
        };
    }
    let pointwise = r == 1 && s == 1 && stride(0) == 1 && stride(1) == 1;
    // an image stem with a small kernel: no workspace in fp32, and none for
    // the forward in half precision
    let stem = c <= 4 && r <= 3 && s <= 3;
    let stem_without = stem && (elem == 4 || call.kind == ConvPass::Forward);
    if call.channels_last || pointwise || stem_without {
        return 0;
    }
    // half-precision tensor-core kernels take channels in eights: an
    // image's three are padded, in the input and the filter
    let pad = |channels: u64| {
        if elem < 4 && call.groups == 1 {
            channels.max(8)
        } else {
            channels
        }
    };
    let (cin, cg) = (pad(c), pad(call.weight[1]));
    let input = n * cin * h * w * elem;
    let output = n * k * out_dim(h, 0, r) * out_dim(w, 1, s) * elem;
    let filter = k * cg * r * s * elem;
    let transposed = input + output + filter;
    match call.kind {
        ConvPass::Weight => transposed + WEIGHT_GRADIENT_EXTRA,
        ConvPass::Forward | ConvPass::Input => transposed,
    }
}

/// A contiguous fp16 depthwise convolution whose weight gradient cuDNN runs
/// with the transposed tensors (measured on the H200; see the module's
/// notes): at least 32 channels, a square 3x3 or 5x5 without dilation, maps
/// of at least 28x28, and stride 1, or stride 2 from 256 channels.
fn fp16_depthwise_in_cudnn(call: &ConvCall) -> bool {
    let (c, h, w) = (call.input[1], call.input[2], call.input[3]);
    let (r, s) = (call.weight[2], call.weight[3]);
    let all = |v: &[u64], x: u64| v.iter().all(|&e| e == x);
    let stride = match call.stride.as_slice() {
        [a, b] if a == b => *a,
        _ => return false,
    };
    call.dtype == "float16"
        && c >= 32
        && r == s
        && (r == 3 || r == 5)
        && all(&call.dilation, 1)
        && h >= 28
        && w >= 28
        && (stride == 1 || (stride == 2 && c >= 256))
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
