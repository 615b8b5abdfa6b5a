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

fn bf16(mut c: ConvCall) -> ConvCall {
    c.dtype = "bfloat16".into();
    c
}

/// Each case's workspace is within 3 % or 1 MiB of its measurement.
fn assert_within_measurements(cases: &[(&str, ConvCall, u64)]) {
    for (what, c, measured) in cases {
        let got = workspace_rule(c);
        assert!(
            got.abs_diff(*measured) <= (measured * 3 / 100).max(MIB),
            "{what}: {got} bytes, measured {measured}"
        );
    }
}

#[test]
fn the_workspaces_measured_on_the_h200_are_what_the_rule_gives() {
    use ConvPass::*;
    let cl = channels_last;
    // (what, call, measured bytes; H200, cuDNN 9.19, PyTorch 2.11: whole
    // runs in data/calibration/h200-origins, single calls in
    // data/calibration/h200-conv-workspaces)
    let cases = [
        // VGG-16-BN at batch 32: its stem's forward takes none; its second
        // convolution the input, the output and the filter in each call,
        // the weight gradient's some partial sums more
        (
            "vgg stem forward",
            call(Forward, [32, 3, 224, 224], 64, 3, 1, 1),
            0,
        ),
        (
            "vgg stem weight, fp32",
            call(Weight, [32, 3, 224, 224], 64, 3, 1, 1),
            0,
        ),
        (
            "vgg 64->64 forward",
            call(Forward, [32, 64, 224, 224], 64, 3, 1, 1),
            822_231_187,
        ),
        (
            "vgg 64->64 input",
            call(Input, [32, 64, 224, 224], 64, 3, 1, 1),
            822_231_187,
        ),
        (
            "vgg 64->64 weight",
            call(Weight, [32, 64, 224, 224], 64, 3, 1, 1),
            824_296_103,
        ),
        (
            "vgg 256->256 weight",
            call(Weight, [32, 256, 56, 56], 256, 3, 1, 1),
            214_958_687,
        ),
        (
            "vgg 512->512 forward",
            call(Forward, [32, 512, 14, 14], 512, 3, 1, 1),
            35_127_312,
        ),
        // ResNet-18's 7x7 stem of stride 2 and a 3x3 of stride 2, batch 128;
        // a 3x3 in bf16 at batch 256
        (
            "resnet stem",
            call(Forward, [128, 3, 224, 224], 64, 7, 2, 1),
            488_149_776,
        ),
        // in bf16 the stem's three channels are padded to eight (ResNet-34
        // at batch 96; EfficientNet-B0's 3x3 stem at batch 64, whose
        // forward takes none)
        (
            "resnet stem bf16",
            bf16(call(Forward, [96, 3, 224, 224], 64, 7, 2, 1)),
            231_261_200,
        ),
        (
            "resnet stem bf16 weight",
            bf16(call(Weight, [96, 3, 224, 224], 64, 7, 2, 1)),
            237_382_800,
        ),
        (
            "effnet stem bf16",
            bf16(call(Forward, [64, 3, 224, 224], 32, 3, 2, 1)),
            0,
        ),
        (
            "effnet stem bf16 weight",
            bf16(call(Weight, [64, 3, 224, 224], 32, 3, 2, 1)),
            103_926_416,
        ),
        (
            "resnet 128->256 s2",
            call(Forward, [128, 128, 28, 28], 256, 3, 2, 1),
            78_250_131,
        ),
        (
            "resnet 64->64 bf16",
            bf16(call(Forward, [256, 64, 56, 56], 64, 3, 1, 1)),
            205_594_771,
        ),
        // ResNet-50's bottleneck 1x1: a matrix product on the data as it lies
        (
            "resnet50 1x1 256->64",
            call(Forward, [64, 256, 56, 56], 64, 1, 1, 1),
            0,
        ),
        // ConvNeXt-S at batch 48, fp32: its depthwise 7x7 get channels-last
        // inputs and go to cuDNN (the weight gradient's partial sums), a
        // contiguous one to ATen; its downsampling 2x2 is channels-last too
        (
            "convnext dw stage 1",
            cl(call(Weight, [48, 96, 56, 56], 96, 7, 1, 96)),
            472_360_567,
        ),
        (
            "convnext dw stage 2",
            cl(call(Weight, [48, 192, 28, 28], 192, 7, 1, 192)),
            241_451_791,
        ),
        (
            "convnext dw stage 3",
            cl(call(Weight, [48, 384, 14, 14], 384, 7, 1, 384)),
            8_389_247,
        ),
        (
            "convnext dw stage 4",
            cl(call(Weight, [48, 768, 7, 7], 768, 7, 1, 768)),
            3_539_535,
        ),
        (
            "convnext dw forward",
            cl(call(Forward, [48, 96, 56, 56], 96, 7, 1, 96)),
            0,
        ),
        (
            "convnext dw input",
            cl(call(Input, [48, 96, 56, 56], 96, 7, 1, 96)),
            0,
        ),
        (
            "convnext dw contiguous",
            call(Weight, [48, 96, 56, 56], 96, 7, 1, 96),
            0,
        ),
        (
            "convnext downsample",
            cl(call(Weight, [48, 96, 56, 56], 192, 2, 2, 1)),
            0,
        ),
    ];
    assert_within_measurements(&cases);
}

#[test]
fn the_rule_reads_the_output_size_from_stride_padding_and_dilation() {
    // 3x3, stride 2, padding 1: 56 -> 28; filter 128 x 64 x 3 x 3
    let c = call(ConvPass::Forward, [8, 64, 56, 56], 128, 3, 2, 1);
    let (input, output, filter) = (
        8 * 64 * 56 * 56 * 4,
        8 * 128 * 28 * 28 * 4,
        128 * 64 * 9 * 4,
    );
    assert_eq!(workspace_rule(&c), input + output + filter);
    // dilation 2 without padding: 56 - 4 = 52
    let mut d = call(ConvPass::Forward, [8, 64, 56, 56], 128, 3, 1, 1);
    d.padding = vec![0, 0];
    d.dilation = vec![2, 2];
    assert_eq!(workspace_rule(&d), input + 8 * 128 * 52 * 52 * 4 + filter);
    // a 1x1 of stride 2 subsamples, which the tensor-core path transposes for
    let s = call(ConvPass::Forward, [8, 64, 56, 56], 128, 1, 2, 1);
    assert_eq!(
        workspace_rule(&s),
        input + 8 * 128 * 28 * 28 * 4 + 128 * 64 * 4
    );
    // the weight gradient takes the partial sums besides
    let mut w = c.clone();
    w.kind = ConvPass::Weight;
    assert_eq!(
        workspace_rule(&w),
        workspace_rule(&c) + WEIGHT_GRADIENT_EXTRA
    );
    let mut i = c.clone();
    i.kind = ConvPass::Input;
    assert_eq!(workspace_rule(&i), workspace_rule(&c));
}

#[test]
fn an_image_stem_up_to_four_channels_and_3x3_takes_none_but_for_half_precision_gradients() {
    let stem = |c: u64, r: u64, kind: ConvPass| call(kind, [8, c, 224, 224], 32, r, 2, 1);
    assert_eq!(workspace_rule(&stem(3, 3, ConvPass::Forward)), 0);
    assert_eq!(workspace_rule(&stem(4, 3, ConvPass::Forward)), 0);
    // in fp32 none of its calls; in half precision its gradients do
    assert_eq!(workspace_rule(&stem(3, 3, ConvPass::Weight)), 0);
    assert_eq!(workspace_rule(&stem(3, 3, ConvPass::Input)), 0);
    assert!(workspace_rule(&bf16(stem(3, 3, ConvPass::Weight))) > 0);
    assert!(workspace_rule(&bf16(stem(3, 3, ConvPass::Input))) > 0);
    assert_eq!(workspace_rule(&bf16(stem(3, 3, ConvPass::Forward))), 0);
    for other in [stem(5, 3, ConvPass::Forward), stem(3, 5, ConvPass::Forward)] {
        assert!(workspace_rule(&other) > 0, "{other:?}");
    }
    // a kernel 3 high and 5 wide is not a 3x3
    let mut wide = stem(3, 3, ConvPass::Forward);
    wide.weight[3] = 5;
    assert!(workspace_rule(&wide) > 0);
}

#[test]
fn half_precision_pads_fewer_than_eight_channels_to_eight() {
    let padded = |c: u64| {
        let call = bf16(call(ConvPass::Input, [4, c, 32, 32], 16, 5, 1, 1));
        workspace_rule(&call)
    };
    let output = 4 * 16 * 32 * 32 * 2;
    let eight = 4 * 8 * 32 * 32 * 2 + output + 16 * 8 * 25 * 2;
    for c in [1, 3, 7] {
        assert_eq!(padded(c), eight, "{c} channels");
    }
    assert_eq!(padded(8), eight);
    assert_eq!(padded(9), 4 * 9 * 32 * 32 * 2 + output + 16 * 9 * 25 * 2);
    // fp32 is not padded
    let fp32 = call(ConvPass::Input, [4, 3, 32, 32], 16, 5, 1, 1);
    assert_eq!(
        workspace_rule(&fp32),
        4 * 3 * 32 * 32 * 4 + 2 * output + 16 * 3 * 25 * 4
    );
    // nor are grouped convolutions' channels
    let grouped = bf16(call(ConvPass::Input, [4, 6, 32, 32], 6, 5, 1, 2));
    assert_eq!(
        workspace_rule(&grouped),
        4 * 6 * 32 * 32 * 2 + 4 * 6 * 32 * 32 * 2 + 6 * 3 * 25 * 2
    );
}

#[test]
fn the_partial_sums_are_large_from_16_mib_of_input() {
    // 16 MiB of fp32 input: 1 x 16 x 512 x 512
    let at = channels_last(call(ConvPass::Weight, [1, 16, 512, 512], 16, 3, 1, 16));
    assert_eq!(workspace_rule(&at), (16 * MIB) * 84 / 10);
    let below = channels_last(call(ConvPass::Weight, [1, 16, 512, 511], 16, 3, 1, 16));
    assert_eq!(workspace_rule(&below), (16 * 512 * 511 * 4) * 6 / 10);
    // bf16 halves the input's bytes
    assert_eq!(workspace_rule(&bf16(at)), (8 * MIB) * 6 / 10);
}

#[test]
fn calls_the_rule_does_not_model_take_no_workspace() {
    let base = call(ConvPass::Weight, [48, 96, 56, 56], 96, 3, 1, 1);
    assert!(workspace_rule(&base) > 0);
    let mut transposed = base.clone();
    transposed.transposed = true;
    let mut three_d = base.clone();
    three_d.input = vec![48, 96, 4, 56, 56];
    three_d.weight = vec![96, 96, 3, 3, 3];
    let mut int8 = base.clone();
    int8.dtype = "int8".into();
    // a 2-D input with a 1-D filter is not a 2-D convolution either
    let mut one_d_filter = base.clone();
    one_d_filter.weight = vec![96, 96, 3];
    // one 1x1 of stride 1 in each spatial dimension only
    let mut pointwise = call(ConvPass::Weight, [48, 96, 56, 56], 96, 1, 1, 1);
    assert_eq!(workspace_rule(&pointwise), 0);
    pointwise.stride = vec![1, 2];
    assert!(workspace_rule(&pointwise) > 0);
    for c in [transposed, three_d, int8, one_d_filter, channels_last(base)] {
        assert_eq!(workspace_rule(&c), 0, "{c:?}");
    }
    // grouped but not depthwise (ResNeXt's 32 groups) is a dense one
    let grouped = call(ConvPass::Forward, [48, 96, 56, 56], 96, 3, 1, 32);
    assert!(workspace_rule(&grouped) > 0);
}

#[test]
fn half_precision_halves_the_transposed_tensors() {
    let full = call(ConvPass::Input, [16, 128, 28, 28], 256, 3, 1, 1);
    assert_eq!(
        workspace_rule(&bf16(full.clone())) * 2,
        workspace_rule(&full)
    );
    let mut fp16 = full.clone();
    fp16.dtype = "float16".into();
    assert_eq!(workspace_rule(&fp16) * 2, workspace_rule(&full));
}

fn fp16(mut c: ConvCall) -> ConvCall {
    c.dtype = "float16".into();
    c
}

#[test]
fn fp16_depthwise_weight_gradients_take_cudnns_workspace_where_it_was_measured() {
    use ConvPass::*;
    let dw = |n: u64, c: u64, hw: u64, r: u64, stride: u64| {
        fp16(call(Weight, [n, c, hw, hw], c, r, stride, c))
    };
    // (what, call, measured bytes; H200, cuDNN 9.19, PyTorch 2.11, single
    // calls in data/calibration/h200-conv-workspaces; MobileNet-V2 at batch
    // 256 from its recorded run, data/calibration/h200-snapshot-profiles)
    let cases = [
        ("effnet 32ch 3x3 112", dw(128, 32, 112, 3, 1), 205_702_850),
        ("effnet 144ch 3x3 56", dw(128, 144, 56, 3, 1), 231_462_706),
        ("mnv3 72ch 3x3 56", dw(128, 72, 56, 3, 1), 116_150_106),
        ("mnv3 120ch 5x5 28", dw(128, 120, 28, 5, 1), 48_402_542),
        ("grid 96ch 5x5 224", dw(32, 96, 224, 5, 1), 616_843_118),
        ("grid 96ch 5x5 112", dw(128, 96, 112, 5, 1), 618_737_318),
        ("grid 64ch 3x3 224", dw(32, 64, 224, 3, 1), 412_127_718),
        ("grid 768ch 3x3 112 s2", dw(16, 768, 112, 3, 2), 386_462_990),
        ("mnv2 192ch 3x3 28", dw(256, 192, 28, 3, 1), 155_772_950),
        ("mnv2 144ch 3x3 56", dw(256, 144, 56, 3, 1), 462_673_714),
        ("mnv2 32ch 3x3 112", dw(256, 32, 112, 3, 1), 411_223_746),
        // none on 14x14 and 7x7 maps, of stride 2 below 256 channels, of a
        // 7x7 filter, of fewer than 32 channels
        ("effnet 480ch 3x3 14", dw(128, 480, 14, 3, 1), 0),
        ("mnv3 960ch 5x5 7", dw(128, 960, 7, 5, 1), 0),
        ("effnet 96ch 3x3 112 s2", dw(128, 96, 112, 3, 2), 0),
        ("mnv3 72ch 5x5 56 s2", dw(128, 72, 56, 5, 2), 0),
        ("convnext 96ch 7x7 56", dw(64, 96, 56, 7, 1), 0),
        ("mnv3 16ch 3x3 112", dw(128, 16, 112, 3, 1), 0),
    ];
    assert_within_measurements(&cases);
}

#[test]
fn only_an_fp16_depthwise_weight_gradient_takes_the_transposed_tensors() {
    let weight = fp16(call(ConvPass::Weight, [64, 144, 56, 56], 144, 3, 1, 144));
    let input = 64 * 144 * 56 * 56 * 2;
    assert_eq!(workspace_rule(&weight), 2 * input + 144 * 9 * 2);
    // the forward and the input's gradient run without one
    for kind in [ConvPass::Forward, ConvPass::Input] {
        let mut c = weight.clone();
        c.kind = kind;
        assert_eq!(workspace_rule(&c), 0, "{kind:?}");
    }
    // bf16 and fp32 stay with ATen's kernel
    let mut other = weight.clone();
    for dtype in ["bfloat16", "float32"] {
        other.dtype = dtype.into();
        assert_eq!(workspace_rule(&other), 0, "{dtype}");
    }
    // a dilated or a rectangular filter, a 1x1, a 27-wide map: none
    let mut dilated = weight.clone();
    dilated.dilation = vec![2, 2];
    let mut wide = weight.clone();
    wide.weight[3] = 5;
    let mut pointwise = weight.clone();
    pointwise.weight[2] = 1;
    pointwise.weight[3] = 1;
    let mut narrow = weight.clone();
    narrow.input[3] = 27;
    let mut uneven = weight.clone();
    uneven.stride = vec![1, 2];
    for c in [dilated, wide, pointwise, narrow, uneven] {
        assert_eq!(workspace_rule(&c), 0, "{c:?}");
    }
    // 32 channels and 28x28 are in; stride 2 from 256 channels
    assert!(workspace_rule(&fp16(call(ConvPass::Weight, [8, 32, 28, 28], 32, 3, 1, 32))) > 0);
    assert_eq!(
        workspace_rule(&fp16(call(ConvPass::Weight, [8, 31, 28, 28], 31, 3, 1, 31))),
        0
    );
    assert!(
        workspace_rule(&fp16(call(
            ConvPass::Weight,
            [8, 256, 28, 28],
            256,
            3,
            2,
            256
        ))) > 0
    );
    assert_eq!(
        workspace_rule(&fp16(call(
            ConvPass::Weight,
            [8, 255, 28, 28],
            255,
            3,
            2,
            255
        ))),
        0
    );
    // the output of a stride-2 call is a quarter of the input
    let s2 = fp16(call(ConvPass::Weight, [8, 256, 28, 28], 256, 3, 2, 256));
    let inp = 8 * 256 * 28 * 28 * 2;
    assert_eq!(workspace_rule(&s2), inp + inp / 4 + 256 * 9 * 2);
}

/// The table's line for a call: dtype, the twelve shape fields, then the
/// three workspaces.
fn table_line(dtype: &str, key: [u64; 12]) -> Option<[u64; 3]> {
    measured_text().lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split('\t').collect();
        let nums: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
        (f[0] == dtype && nums[..12] == key).then(|| [nums[12], nums[13], nums[14]])
    })
}

#[test]
fn a_call_the_sweeps_measured_takes_its_measured_workspace_and_any_other_the_rule() {
    // VGG-16's 512-channel 3x3 convolutions on 14x14 in fp32 at batch 64
    // (the ninth set's VGG-16): cuDNN's forward took 74 MiB on the H100,
    // the rule gives the transposed tensors' 58 MiB. At batch 65, which no
    // sweep ran, the rule answers.
    let key = [64, 512, 14, 14, 512, 3, 3, 1, 1, 1, 1, 0];
    let measured = table_line("float32", key).expect("measured at batch 64");
    for (kind, ws) in [
        (ConvPass::Forward, measured[0]),
        (ConvPass::Input, measured[1]),
        (ConvPass::Weight, measured[2]),
    ] {
        let c = call(kind, [64, 512, 14, 14], 512, 3, 1, 1);
        assert_eq!(cudnn_workspace(&c), ws, "{kind:?}");
        let other = call(kind, [65, 512, 14, 14], 512, 3, 1, 1);
        assert_eq!(cudnn_workspace(&other), workspace_rule(&other), "{kind:?}");
    }
    let fwd = call(ConvPass::Forward, [64, 512, 14, 14], 512, 3, 1, 1);
    assert!(measured[0] > workspace_rule(&fwd) + 8 * MIB, "{measured:?}");
    // the dtype and the layout are part of the key
    assert_eq!(
        cudnn_workspace(&bf16(fwd.clone())),
        table_line("bfloat16", key).unwrap()[0]
    );
    let cl = channels_last(fwd);
    assert_eq!(
        cudnn_workspace(&cl),
        table_line("float32", [64, 512, 14, 14, 512, 3, 3, 1, 1, 1, 1, 1])
            .map_or_else(|| workspace_rule(&cl), |w| w[0])
    );
}

#[test]
fn the_measured_table_has_one_line_per_call_each_with_three_workspaces() {
    let mut keys = std::collections::HashSet::new();
    let mut lines = 0;
    for line in measured_text().lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 16, "{line}");
        assert!(["float32", "bfloat16", "float16"].contains(&f[0]), "{line}");
        assert!(f[1..].iter().all(|x| x.parse::<u64>().is_ok()), "{line}");
        assert!(keys.insert(f[..13].join(" ")), "twice: {line}");
        lines += 1;
    }
    assert!(lines > 18000, "{lines}");
    assert_eq!(measured_table().len(), lines);
}
