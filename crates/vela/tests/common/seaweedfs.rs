//! SeaweedFS (`weed server -s3`), the real S3-compatible server of the
//! tiered-storage tests, run through `tests/support/seaweedfs.sh` (which
//! builds `weed` from its Go module once, into a cache outside git). On
//! 127.0.0.1 free ports, its data in a temporary directory; stopped and
//! started again on the same endpoint and data; killed when dropped.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The identity `seaweedfs.sh` configures.
pub(crate) const ACCESS_KEY: &str = "vela-test-key";
pub(crate) const SECRET_KEY: &str = "vela-test-secret";
/// How long a start may take once `weed` is built (a loaded CI machine
/// gets ample slack).
const START_TIMEOUT: Duration = Duration::from_secs(180);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/support/seaweedfs.sh")
}

/// Builds `weed` if it is not cached yet (minutes the first time).
pub(crate) fn build() {
    let status = Command::new("bash")
        .arg(script())
        .arg("build")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .expect("bash runs tests/support/seaweedfs.sh");
    assert!(status.success(), "tests/support/seaweedfs.sh build failed");
}

/// A running SeaweedFS with one bucket.
#[derive(Debug)]
pub(crate) struct SeaweedFs {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`, the same across restarts.
    pub(crate) endpoint: String,
    pub(crate) bucket: String,
}

impl SeaweedFs {
    /// Builds (if needed) and starts a fresh server.
    pub(crate) fn start() -> SeaweedFs {
        build();
        let dir = tempfile::Builder::new()
            .prefix("vela-seaweedfs-")
            .tempdir()
            .unwrap();
        let mut server = SeaweedFs {
            child: None,
            dir,
            endpoint: String::new(),
            bucket: String::new(),
        };
        server.resume();
        server
    }

    /// Starts the server again after `stop` (same data, same endpoint).
    pub(crate) fn resume(&mut self) {
        assert!(self.child.is_none(), "already running");
        let mut child = Command::new("bash")
            .arg(script())
            .arg("serve")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: a stop reaches `weed` too.
            .process_group(0)
            .spawn()
            .expect("bash runs tests/support/seaweedfs.sh");
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = ready_tx.send(line);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let line = match ready_rx.recv_timeout(START_TIMEOUT) {
            Ok(line) => line,
            Err(_) => {
                kill_group(&mut child);
                panic!(
                    "SeaweedFS not ready within {START_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
        };
        // `ready s3 URL bucket NAME`
        let words: Vec<&str> = line.split_whitespace().collect();
        let &[_, _, endpoint, _, bucket] = words.as_slice() else {
            kill_group(&mut child);
            panic!("SeaweedFS did not start ({line:?}): {}", self.log_tail());
        };
        self.endpoint = endpoint.to_string();
        self.bucket = bucket.to_string();
        self.child = Some(child);
    }

    /// Stops the server (SIGTERM, SIGKILL if it hangs) and waits for it.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        for _ in 0..300 {
            if child.try_wait().unwrap().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        kill_group(&mut child);
    }

    /// The `vela` flags of the S3 driver on this server.
    pub(crate) fn vela_args(&self) -> Vec<String> {
        [
            "--offload-driver",
            "aws-s3",
            "--offload-bucket",
            &self.bucket,
            "--offload-service-endpoint",
            &self.endpoint,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// The environment a `vela` process signs with.
    pub(crate) fn vela_env(&self) -> [(&'static str, &'static str); 2] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ]
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// SIGKILL to the whole process group (the script and `weed`).
fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.wait();
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}
