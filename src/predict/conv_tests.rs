use super::*;

const MIB: u64 = 1 << 20;

/// A 2-D convolution call: input `[n, c, h, w]`, weight `[k, c / groups, r, r]`.
fn call(kind: ConvPass, input: [u64; 4], k: u64, r: u64, stride: u64, groups: u64) -> ConvCall {
    ConvCall {
        at: 0,
        kind,
        input: input.to_vec(),
        weight: vec![k, input[1] / groups, r, r],
        stride: vec![stride, stride],
        padding: vec![r / 2, r / 2],
        dilation: vec![1, 1],
        groups,
        transposed: false,
        dtype: "float32".into(),
        channels_last: false,
    }
}

fn channels_last(mut c: ConvCall) -> ConvCall {
    c.channels_last = true;
    c
}

#[test]
fn the_depthwise_workspaces_measured_on_the_h200_are_what_the_rule_gives() {
    use ConvPass::*;
    // ConvNeXt-S's depthwise 7x7, batch 48, fp32, in a whole training run on
    // the H200 (data/calibration/h200-origins): channels-last goes to cuDNN,
    // whose weight gradient keeps partial sums; contiguous to ATen's kernel
    // (measured one at a time, data/calibration/h200-conv-workspaces).
    let cl = channels_last;
    let cases = [
        (
            "stage 1",
            cl(call(Weight, [48, 96, 56, 56], 96, 7, 1, 96)),
            472_360_567,
        ),
        (
            "stage 2",
            cl(call(Weight, [48, 192, 28, 28], 192, 7, 1, 192)),
            241_451_791,
        ),
        (
            "stage 3",
            cl(call(Weight, [48, 384, 14, 14], 384, 7, 1, 384)),
            8_389_247,
        ),
        (
            "stage 4",
            cl(call(Weight, [48, 768, 7, 7], 768, 7, 1, 768)),
            3_539_535,
        ),
        (
            "forward",
            cl(call(Forward, [48, 96, 56, 56], 96, 7, 1, 96)),
            0,
        ),
        (
            "input gradient",
            cl(call(Input, [48, 96, 56, 56], 96, 7, 1, 96)),
            0,
        ),
        (
            "contiguous",
            call(Weight, [48, 96, 56, 56], 96, 7, 1, 96),
            0,
        ),
    ];
    for (what, c, measured) in cases {
        let got = cudnn_workspace(&c);
        // within 3 % or 1 MiB of the measurement
        assert!(
            got.abs_diff(measured) <= (measured * 3 / 100).max(MIB),
            "{what}: {got} bytes, measured {measured}"
        );
    }
}

#[test]
fn the_partial_sums_are_large_from_16_mib_of_input() {
    // 16 MiB of fp32 input: 1 x 16 x 512 x 512
    let at = channels_last(call(ConvPass::Weight, [1, 16, 512, 512], 16, 3, 1, 16));
    assert_eq!(cudnn_workspace(&at), (16 * MIB) * 84 / 10);
    let below = channels_last(call(ConvPass::Weight, [1, 16, 512, 511], 16, 3, 1, 16));
    assert_eq!(cudnn_workspace(&below), (16 * 512 * 511 * 4) * 6 / 10);
    // bf16 halves the input's bytes
    let mut half = at.clone();
    half.dtype = "bfloat16".into();
    assert_eq!(cudnn_workspace(&half), (8 * MIB) * 6 / 10);
}

#[test]
fn calls_the_rule_does_not_model_take_no_workspace() {
    let base = channels_last(call(ConvPass::Weight, [48, 96, 56, 56], 96, 7, 1, 96));
    assert!(cudnn_workspace(&base) > 0);
    let mut transposed = base.clone();
    transposed.transposed = true;
    let mut three_d = base.clone();
    three_d.input = vec![48, 96, 4, 56, 56];
    three_d.weight = vec![96, 1, 3, 7, 7];
    let mut int8 = base.clone();
    int8.dtype = "int8".into();
    // grouped but not depthwise (ResNeXt's 32 groups), and dense (VGG's
    // 3x3: measured, left out; see the module's description)
    let grouped = channels_last(call(ConvPass::Weight, [48, 96, 56, 56], 96, 3, 1, 32));
    let dense = channels_last(call(ConvPass::Weight, [32, 64, 224, 224], 64, 3, 1, 1));
    let contiguous_dense = call(ConvPass::Forward, [32, 64, 224, 224], 64, 3, 1, 1);
    for c in [transposed, three_d, int8, grouped, dense, contiguous_dense] {
        assert_eq!(cudnn_workspace(&c), 0, "{c:?}");
    }
}
