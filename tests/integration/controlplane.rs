//! Starts the real local control plane (`hack/controlplane.sh run`) once per test
//! binary and installs the committed CRDs into it.
//!
//! Set `VRAMFIT_TEST_KUBECONFIG` to run against an already running control plane
//! instead (faster when iterating: `hack/controlplane.sh up`).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    std::thread::spawn(move || match spawn_run_script(&dir) {
        Ok((mut child, path)) => {
            let _ = tx.send(Ok(path));
            let _ = child.wait();
        }
        Err(e) => {
            let _ = tx.send(Err(e));
        }
    });
    // The first run may build kube-apiserver from source.
    match rx.recv_timeout(Duration::from_secs(1800)) {
        Ok(Ok(path)) => path,
        Ok(Err(e)) => panic!("{e}"),
        Err(e) => panic!("control plane did not start: {e}"),
    }
}

/// Starts `hack/controlplane.sh run --dir <dir>` with a parent-death signal
/// (the calling thread's end stops it) and waits for its kubeconfig line.
fn spawn_run_script(dir: &Path) -> Result<(Child, PathBuf), String> {
    let script = repo_root().join("hack/controlplane.sh");
    let mut command = Command::new("bash");
    command
        .arg(&script)
        .arg("run")
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no
    // memory of the parent; it asks the kernel to send SIGTERM to the child
    // when the spawning thread ends.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", script.display()))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    match lines.next() {
        Some(Ok(line)) if line.ends_with("kubeconfig") => Ok((child, PathBuf::from(line))),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "control plane did not start ({other:?}); see {}",
                dir.display()
            ))
        }
    }
}

/// A control plane of one test's own, for tests that restart its parts
/// (which would disturb the shared one). Stopped when dropped.
pub struct PrivateControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PrivateControlPlane {
    /// Starts etcd and kube-apiserver in a fresh folder and installs crds/.
    pub fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("vramfit-cp-{}-{name}", std::process::id()));
        let (tx, rx) = mpsc::channel::<Result<PathBuf, String>>();
        let (stop, stopped) = mpsc::channel::<()>();
        let state_dir = dir.clone();
        // The script's parent-death signal follows this thread, which ends
        // when the control plane is dropped (or with the process).
        let thread = std::thread::spawn(move || match spawn_run_script(&state_dir) {
            Ok((mut child, path)) => {
                let _ = tx.send(Ok(path));
                let _ = stopped.recv();
                // SAFETY: kill(2) on the child's own pid.
                unsafe {
                    libc::kill(child.id() as i32, libc::SIGTERM);
                }
                let _ = child.wait();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
        let kubeconfig = match rx.recv_timeout(Duration::from_secs(600)) {
            Ok(Ok(path)) => path,
            Ok(Err(e)) => panic!("{e}"),
            Err(e) => panic!("control plane did not start: {e}"),
        };
        install_crds(&kubeconfig);
        Self {
            dir,
            kubeconfig,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Its admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Stops `what` (`apiserver` or `etcd`), waits `down`, starts it again on
    /// the same port (etcd on the same data) and waits until the API server
    /// is ready (`hack/controlplane.sh restart`).
    pub async fn restart(&self, what: &str, down: Duration) {
        let status = tokio::process::Command::new("bash")
            .arg(repo_root().join("hack/controlplane.sh"))
            .args(["restart", what, "--dir"])
            .arg(&self.dir)
            .args(["--down", &down.as_secs_f64().to_string()])
            .status()
            .await
            .expect("hack/controlplane.sh runs");
        assert!(
            status.success(),
            "restarting {what} failed; see {}",
            self.dir.display()
        );
    }
}

impl Drop for PrivateControlPlane {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
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
    client_of(kubeconfig()).await
}

/// A client for the control plane of `path`.
pub async fn client_of(path: &Path) -> Client {
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
