//! Starts the real local control plane (`hack/controlplane.sh run`) once per test
//! binary and installs the committed CRDs into it.
//!
//! Set `VRAMFIT_TEST_KUBECONFIG` to run against an already running control plane
//! instead (faster when iterating: `hack/controlplane.sh up`).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The kubeconfig of the shared control plane, starting it on first use.
pub fn kubeconfig() -> &'static Path {
    KUBECONFIG.get_or_init(|| {
        let path = match std::env::var_os("VRAMFIT_TEST_KUBECONFIG") {
            Some(path) => PathBuf::from(path),
            None => start_control_plane(),
        };
        install_crds(&path);
        path
    })
}

/// Runs the control plane in the foreground from a thread that lives as long as
/// the test process, so that the parent-death signal reaches the script when the
/// process ends and the script stops etcd and kube-apiserver.
fn start_control_plane() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramfit-cp-{}", std::process::id()));
    let (tx, rx) = mpsc::channel::<Result<PathBuf, String>>();
    let script = repo_root().join("hack/controlplane.sh");
    let state_dir = dir.clone();
    std::thread::spawn(move || {
        let mut command = Command::new("bash");
        command
            .arg(&script)
            .arg("run")
            .arg("--dir")
            .arg(&state_dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no
        // memory of the parent; it asks the kernel to send SIGTERM to the child
        // when this thread ends, which happens only when the test process exits.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                let _ = tx.send(Err(format!("cannot start {}: {e}", script.display())));
                return;
            }
        };
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        match lines.next() {
            Some(Ok(line)) if line.ends_with("kubeconfig") => {
                let _ = tx.send(Ok(PathBuf::from(line)));
            }
            other => {
                let _ = tx.send(Err(format!(
                    "control plane did not start ({other:?}); see {}",
                    state_dir.display()
                )));
                return;
            }
        }
        let _ = child.wait();
    });
    // The first run may build kube-apiserver from source.
    match rx.recv_timeout(Duration::from_secs(1800)) {
        Ok(Ok(path)) => path,
        Ok(Err(e)) => panic!("{e}"),
        Err(e) => panic!("control plane did not start: {e}"),
    }
}

fn install_crds(kubeconfig: &Path) {
    let status = Command::new("bash")
        .arg(repo_root().join("hack/controlplane.sh"))
        .args(["crds", "--kubeconfig"])
        .arg(kubeconfig)
        .status()
        .expect("hack/controlplane.sh runs");
    assert!(status.success(), "installing crds/ failed");
}

/// A client for the shared control plane.
pub async fn client() -> Client {
    let path = kubeconfig();
    let kubeconfig = Kubeconfig::read_from(path).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig is usable");
    Client::try_from(config).expect("client builds")
}

/// `kubectl` against the shared control plane.
pub fn kubectl() -> Command {
    let mut command = Command::new("kubectl");
    command.env("KUBECONFIG", kubeconfig());
    command
}
