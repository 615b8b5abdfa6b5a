//! The controller's `/ui` page in headless Chromium, against the local control
//! plane with the controller running and a simulated GPU node: the DOM has each
//! GPU with its bars, the jobs, the waiting queue and the OOM retry, and the
//! screenshot shows the bars in their colours.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vramfit::api::Phase;

use crate::driver::{GIB, TestCluster, free_port, http_get, mlp_job};

const OOM_TEXT: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.";

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        for dir in ["/usr/bin", "/usr/local/bin"] {
            let path = Path::new(dir).join(name);
            if path.exists() {
                return path;
            }
        }
    }
    panic!("headless Chromium is needed for the /ui test: apt-get install chromium (.ci/run does)");
}

/// Runs headless Chromium with a fresh profile and no network but loopback.
fn headless(profile: &Path, args: &[&str]) -> String {
    let output = Command::new("timeout")
        .arg("90")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,1600",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// An 8-bit RGB or RGBA PNG, decoded: width, height and RGB pixels.
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<[u8; 3]>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut width, mut height, mut channels) = (0u32, 0u32, 0usize);
    let mut data = Vec::new();
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = &bytes[at + 4..at + 8];
        let body = &bytes[at + 8..at + 8 + len];
        match kind {
            b"IHDR" => {
                width = u32::from_be_bytes(body[0..4].try_into().unwrap());
                height = u32::from_be_bytes(body[4..8].try_into().unwrap());
                assert_eq!(body[8], 8, "8-bit samples");
                assert_eq!(body[12], 0, "not interlaced");
                channels = match body[9] {
                    2 => 3,
                    6 => 4,
                    other => panic!("PNG colour type {other}"),
                };
            }
            b"IDAT" => data.extend_from_slice(body),
            b"IEND" => break,
            _ => {}
        }
        at += 12 + len;
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&data[..])
        .read_to_end(&mut raw)
        .expect("PNG data inflates");
    let stride = width as usize * channels;
    let mut previous = vec![0u8; stride];
    let mut pixels = Vec::with_capacity((width * height) as usize);
    for row in raw.chunks(stride + 1).take(height as usize) {
        let (filter, line) = (row[0], &row[1..]);
        let mut current = vec![0u8; stride];
        for i in 0..stride {
            let a = if i >= channels {
                current[i - channels]
            } else {
                0
            };
            let b = previous[i];
            let c = if i >= channels {
                previous[i - channels]
            } else {
                0
            };
            let predicted = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((a as u16 + b as u16) / 2) as u8,
                4 => {
                    let p = a as i16 + b as i16 - c as i16;
                    let (pa, pb, pc) = (
                        (p - a as i16).abs(),
                        (p - b as i16).abs(),
                        (p - c as i16).abs(),
                    );
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                other => panic!("PNG filter {other}"),
            };
            current[i] = line[i].wrapping_add(predicted);
        }
        pixels.extend(current.chunks(channels).map(|p| [p[0], p[1], p[2]]));
        previous = current;
    }
    (width, height, pixels)
}

fn count_near(pixels: &[[u8; 3]], colour: [u8; 3]) -> usize {
    pixels
        .iter()
        .filter(|p| p.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= 6))
        .count()
}

#[tokio::test]
async fn the_ui_page_shows_gpus_jobs_waiting_queue_and_retries_in_chromium() {
    let cluster = TestCluster::new("ui").await;
    let node = cluster
        .add_gpu_node("gpu", &[("H200", 140 * GIB), ("H200", 140 * GIB)])
        .await;
    let port = free_port();
    let _controller = cluster.start_controller_at(&format!("127.0.0.1:{port}"));

    cluster
        .apply_job(mlp_job("small-a", 64, 8, 1, Some("70Gi")))
        .await;
    cluster
        .apply_job(mlp_job("small-b", 64, 8, 1, Some("35Gi")))
        .await;
    cluster
        .apply_job(mlp_job("huge", 64, 8, 1, Some("200Gi")))
        .await;
    cluster.apply_job(mlp_job("oomer", 64, 8, 1, None)).await;
    cluster.wait_phase("small-a", Phase::Placed).await;
    cluster.wait_phase("small-b", Phase::Placed).await;
    cluster
        .wait_job("huge", "a reason to wait", |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.phase == Phase::Pending && s.message.is_some())
        })
        .await;
    cluster.wait_phase("oomer", Phase::Placed).await;
    cluster.wait_pod("oomer-a1").await;
    cluster.kubelet_running("oomer-a1").await;
    cluster.kubelet_exit("oomer-a1", 42, OOM_TEXT).await;
    cluster
        .wait_job("oomer", "attempt 2 placed", |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.attempt == 2 && s.phase == Phase::Placed)
        })
        .await;
    let small_a = cluster.wait_pod("small-a-a1").await;
    cluster.kubelet_running("small-a-a1").await;
    let gpu = cluster
        .wait_phase("small-a", Phase::Running)
        .await
        .status
        .unwrap()
        .placement
        .unwrap()
        .gpus[0]
        .index;
    assert_eq!(small_a.metadata.name.as_deref(), Some("small-a-a1"));
    cluster
        .agent_reports_process(&node, gpu as usize, "small-a-a1", 42 * GIB, 45 * GIB)
        .await;

    // The JSON behind the page, once it has all of the above.
    let deadline = Instant::now() + Duration::from_secs(30);
    let view: serde_json::Value = loop {
        if let Ok((200, body)) = http_get(port, "/ui/status.json", None) {
            let view: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
            // The page shows the controller's nodes only (its --node-selector).
            assert_eq!(view["nodes"].as_array().unwrap().len(), 1, "{view}");
            assert_eq!(view["nodes"][0]["name"], node.as_str());
            let measured = view["nodes"][0]["gpus"][gpu as usize]["measuredBytes"].as_u64();
            if measured == Some(42 * GIB) && !view["retries"].as_array().unwrap().is_empty() {
                break view;
            }
        }
        assert!(
            Instant::now() < deadline,
            "/ui/status.json never showed the cluster"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(view["waiting"][0]["name"], "huge");
    assert_eq!(view["retries"][0]["name"], "oomer");
    assert_eq!(view["retries"][0]["from"], "8x8");
    assert_eq!(view["retries"][0]["to"], "4x16");

    // `kubectl get gn` shows what the controller wrote into the GpuNode.
    let deadline = Instant::now() + Duration::from_secs(30);
    let committed = loop {
        let gpu_nodes: kube::Api<vramfit::api::GpuNode> = kube::Api::all(cluster.client.clone());
        let allocation = gpu_nodes
            .get_status(&node)
            .await
            .unwrap()
            .status
            .and_then(|s| s.allocation);
        if let Some(a) = allocation.filter(|a| a.committed_bytes >= 105 * GIB) {
            break a;
        }
        assert!(Instant::now() < deadline, "no allocation in GpuNode {node}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(committed.jobs, 3);
    let table = |wide: bool| {
        let mut command = crate::controlplane::kubectl();
        command.args(["get", "gn", &node]);
        if wide {
            command.args(["-o", "wide"]);
        }
        String::from_utf8(command.output().unwrap().stdout).unwrap()
    };
    let plain = table(false);
    assert!(
        plain.contains("COMMITTED") && plain.contains("FREE"),
        "{plain}"
    );
    assert!(plain.contains(&committed.committed), "{plain}");
    assert!(!plain.contains("FREE-PER-GPU"), "{plain}");
    let wide = table(true);
    assert!(
        wide.contains("FREE-PER-GPU") && wide.contains(" 0:") && wide.contains("GiB 1:"),
        "{wide}"
    );

    let dir = std::env::temp_dir().join(format!("vramfit-ui-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("http://127.0.0.1:{port}/ui");
    let dom = headless(&dir.join("profile-dom"), &["--dump-dom", &url]);
    let job_gpu = format!("id=\"gpu-{node}-{gpu}\"");
    for expected in [
        "<title>vramfit status</title>",
        &format!("id=\"gpu-{node}-0\""),
        &format!("id=\"gpu-{node}-1\""),
        "data-job=\"t-ui/small-a\"",
        "data-job=\"t-ui/small-b\"",
        "class=\"waiting\" data-job=\"t-ui/huge\"",
        "class=\"retry\" data-job=\"t-ui/oomer\"",
        "Waiting (1)",
        "measured 42.0 GiB (30.0%)",
        "http-equiv=\"refresh\"",
    ] {
        assert!(dom.contains(expected), "the page lacks {expected}:\n{dom}");
    }
    assert!(dom.contains(&job_gpu));
    // small-a's GPU: 70 GiB of 140 committed, 42 GiB measured.
    let block = &dom[dom.find(&job_gpu).unwrap()..];
    assert!(block.contains("class=\"committed\" style=\"width:"));
    assert!(block.contains("data-measured-bytes=\"45097156608\""));

    let png = dir.join("ui.png");
    headless(
        &dir.join("profile-shot"),
        &[&format!("--screenshot={}", png.display()), &url],
    );
    let bytes = std::fs::read(&png).expect("the screenshot is written");
    let (width, height, pixels) = decode_png(&bytes);
    assert_eq!((width, height), (1280, 1600));
    let committed = count_near(&pixels, [0x54, 0xae, 0xff]);
    let measured = count_near(&pixels, [0x1a, 0x7f, 0x37]);
    let background = count_near(&pixels, [0xf6, 0xf8, 0xfa]);
    // Bars are ~1 rem high and up to 44 rem wide: thousands of pixels each.
    assert!(
        committed > 2_000,
        "committed bars: {committed} pixels in {}",
        png.display()
    );
    assert!(
        measured > 1_000,
        "measured bar: {measured} pixels in {}",
        png.display()
    );
    assert!(
        background > (width * height / 4) as usize,
        "not the page's background"
    );
    let _ = std::fs::remove_dir_all(dir.join("profile-dom"));
    let _ = std::fs::remove_dir_all(dir.join("profile-shot"));
}
