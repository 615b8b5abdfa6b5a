#[test]
#[ignore]
fn diag_zero() {
    use super::job::JobInput;
    let text = std::fs::read_to_string("data/calibration/h200x2-zero.jsonl").unwrap();
    const G: f64 = (1u64 << 30) as f64;
    for raw in text.lines() {
        let v: serde_json::Value = serde_json::from_str(raw).unwrap();
        let job: JobInput = serde_json::from_value(v["spec"].clone()).unwrap();
        let p = super::predict_model(&job.model, &job.shape(), super::default_gpu()).unwrap();
        let m = &v["measured"];
        let ma = m["maxAllocatedBytes"].as_u64().unwrap() as f64 / G;
        let mr = m["maxReservedBytes"].as_u64().unwrap() as f64 / G;
        let pa = p.allocated_bytes as f64 / G;
        let pr = p.reserved_bytes as f64 / G;
        println!("{:40} {:7} alloc m {:.3} p {:.3} d {:+.3} | res m {:.3} p {:.3} d {:+.3} | gap m {:.3} p {:.3}",
            v["name"].as_str().unwrap(), v["split"].as_str().unwrap(), ma, pa, pa-ma, mr, pr, pr-mr, mr-ma, pr-pa);
    }
}
