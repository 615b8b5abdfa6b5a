use super::*;

const H200: ReduceDevice = ReduceDevice {
    sms: 132,
    threads_per_sm: 2048,
};
const MIB: u64 = 1 << 20;

#[test]
fn the_staging_buffers_measured_on_the_h200_are_what_the_launch_configuration_gives() {
    // (case, outputs, rows, buffer): sizes the H200's allocation history
    // recorded for sum_out in the backward (data/calibration/h200-origins).
    let cases = [
        (
            "Phi-3 RMSNorm weight, 1024 wide, 2 x 2048 tokens",
            1024,
            4096,
            32 * MIB,
        ),
        (
            "ViT 512-wide bias, 64 x 197 tokens",
            512,
            12_608,
            51_642_368,
        ),
        (
            "ViT 2048-wide bias, 64 x 197 tokens",
            2048,
            12_608,
            132 * MIB,
        ),
    ];
    for (name, outputs, rows, buffer) in cases {
        let got = column_sum_staging(outputs, rows, 4, H200).expect(name);
        assert_eq!(got.buffer, buffer, "{name}");
    }
    assert_eq!(
        column_sum_staging(1024, 4096, 4, H200).unwrap().semaphores,
        32,
        "one int per block column: 1024 / 4 outputs a thread, 32 lanes"
    );
}

#[test]
fn few_rows_or_many_outputs_need_no_staging() {
    let cases = [
        ("one row", 1024, 1),
        ("255 rows", 1024, 255),
        ("255 values a thread after the warp split", 1024, 4 * 255),
        ("nothing to sum", 1024, 0),
        ("no output", 0, 4096),
        // 1 << 20 outputs fill 8192 block columns, more than 132 x 16.
        ("enough outputs to fill the GPU", 1 << 20, 4096),
    ];
    for (name, outputs, rows) in cases {
        assert_eq!(column_sum_staging(outputs, rows, 4, H200), None, "{name}");
    }
    // 256 values a thread after the split: the rows go across blocks.
    assert!(column_sum_staging(1024, 4 * 256, 4, H200).is_some());
}

#[test]
fn the_buffer_grows_with_the_gpu_and_the_vector_width_follows_the_outputs() {
    let small = ReduceDevice {
        sms: 40,
        threads_per_sm: 1024,
    };
    let h200 = column_sum_staging(1024, 1 << 16, 4, H200).unwrap().buffer;
    let t4 = column_sum_staging(1024, 1 << 16, 4, small).unwrap().buffer;
    assert!(t4 < h200, "{t4} < {h200}");
    // An odd width loads one output a thread: 32 lanes x 16 warps of 1023.
    let odd = column_sum_staging(1023, 1 << 16, 4, H200).unwrap();
    assert_eq!(odd.semaphores, 4 * 1023_u64.div_ceil(32));
    assert_eq!(odd.buffer % (4 * 1023 * 32), 0);
    assert_eq!(last_pow2(0), 1);
    assert_eq!(last_pow2(5), 4);
    assert_eq!(last_pow2(64), 64);
}

#[test]
fn the_blocks_split_an_output_only_when_the_gpu_has_room_and_each_gets_a_share() {
    // A GPU of one multiprocessor for 128 threads: one block at a time.
    let tiny = ReduceDevice {
        sms: 1,
        threads_per_sm: 128,
    };
    // 128 outputs: 32 lanes of 4, 4 warps; one block column, as many as the
    // GPU holds. 2048 rows: 512 values a thread, two blocks of 256 each.
    let two = column_sum_staging(128, 2048, 4, tiny).unwrap();
    assert_eq!(two.buffer, 4 * 128 * 2 * 32 * 4);
    assert_eq!(two.semaphores, 4);
    // 1024 rows: 256 values a thread, one block is enough.
    assert_eq!(column_sum_staging(128, 1024, 4, tiny), None);
    // 256 outputs: two block columns, more than the GPU holds.
    assert_eq!(column_sum_staging(256, 1 << 16, 4, tiny), None);
    // 64 outputs: 16 lanes of 4 (not 32), 8 warps; 4096 rows, 512 values a
    // thread: 32 blocks (the H200 holds 2112).
    let narrow = column_sum_staging(64, 4096, 4, H200).unwrap();
    assert_eq!(narrow.buffer, 4 * 64 * 32 * 16 * 4);
    // No output but many rows: nothing to stage, and no division by zero.
    assert_eq!(column_sum_staging(0, 1 << 20, 4, H200), None);
}
