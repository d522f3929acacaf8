//! What the integration tests share: a `vela standalone` process on free
//! ports on 127.0.0.1 (started, waited for until its ready line, killed when
//! dropped), its resident memory, and plain HTTP/1.1 requests to its admin
//! port.
//!
//! Each test binary compiles this module on its own (`mod common;`) and uses
//! only part of it, hence `dead_code` is allowed here.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod geo;
pub(crate) mod offload;
pub(crate) mod seaweedfs;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long `vela standalone` may take to print its ready line (it is ready in
/// well under a second; a loaded CI machine gets ample slack).
pub(crate) const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Failure bound for one HTTP request to the admin port.
pub(crate) const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `vela standalone`; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub(crate) struct Standalone {
    child: Child,
    /// `pulsar://H:P` as the ready line printed it.
    pub(crate) pulsar_url: String,
    pub(crate) pulsar_addr: SocketAddr,
    pub(crate) http_addr: SocketAddr,
    /// The data directory when the standalone owns it (removed after the
    /// process is killed: fields drop in order).
    _data_dir: Option<tempfile::TempDir>,
}

impl Standalone {
    /// On a fresh temporary data directory, removed when dropped; `args`
    /// follow `--data-dir D --port 0 --http-port 0`.
    pub(crate) fn start(args: &[&str]) -> Standalone {
        let data_dir = tempfile::tempdir().unwrap();
        let mut standalone = Standalone::start_in(data_dir.path(), args);
        standalone._data_dir = Some(data_dir);
        standalone
    }

    /// On `data_dir`, which outlives the process (a restart finds the same
    /// data); `args` follow `--data-dir D --port 0 --http-port 0`.
    pub(crate) fn start_in(data_dir: &Path, args: &[&str]) -> Standalone {
        Standalone::start_in_env(data_dir, args, &[])
    }

    /// As `start_in`, with these environment variables set for the process.
    pub(crate) fn start_in_env(
        data_dir: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Standalone {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vela"))
            .arg("standalone")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--port", "0", "--http-port", "0"])
            .args(args)
            // VELA_LOG=debug when debugging a failure.
            .env(
                "VELA_LOG",
                std::env::var("VELA_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("vela standalone starts");
        // A thread reads the ready line, then drains stdout for the broker's
        // lifetime so a later print can neither block nor fail it.
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = ready_tx.send(line);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        let Ok(line) = ready_rx.recv_timeout(STARTUP_TIMEOUT) else {
            let _ = child.kill();
            panic!("vela standalone printed no ready line within {STARTUP_TIMEOUT:?}");
        };
        // The ready line: `vela standalone ready in N ms: pulsar://H:P http://H:P ...`.
        let url_and_addr = |scheme: &str| -> Option<(String, SocketAddr)> {
            let url = line
                .split_whitespace()
                .find(|word| word.starts_with(scheme))?;
            let addr = url[scheme.len()..].trim_end_matches('/').parse().ok()?;
            Some((url.to_owned(), addr))
        };
        let (Some((pulsar_url, pulsar_addr)), Some((_, http_addr))) =
            (url_and_addr("pulsar://"), url_and_addr("http://"))
        else {
            let _ = child.kill();
            let status = child.wait().unwrap();
            panic!("vela standalone did not get ready (printed {line:?}, exited {status})");
        };
        Standalone {
            child,
            pulsar_url,
            pulsar_addr,
            http_addr,
            _data_dir: None,
        }
    }

    /// SIGKILL, and waits for the process to end.
    pub(crate) fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Resident memory of the process, MiB.
    pub(crate) fn rss_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kib / 1024
    }

    /// `GET path`: the status code and body.
    pub(crate) fn http_get(&self, path: &str) -> (u16, String) {
        self.http(&format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.http_addr
        ))
    }

    /// `PUT path` with a JSON `body`: the status code and body.
    pub(crate) fn http_put_json(&self, path: &str, body: &str) -> (u16, String) {
        self.http(&format!(
            "PUT {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.http_addr,
            body.len()
        ))
    }

    /// `POST path` with a JSON `body`: the status code and body.
    pub(crate) fn http_post_json(&self, path: &str, body: &str) -> (u16, String) {
        self.http(&format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.http_addr,
            body.len()
        ))
    }

    /// `DELETE path`: the status code and body.
    pub(crate) fn http_delete(&self, path: &str) -> (u16, String) {
        self.http(&format!(
            "DELETE {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.http_addr
        ))
    }

    /// The text of `/metrics`.
    pub(crate) fn metrics(&self) -> String {
        self.http_get("/metrics").1
    }

    /// `GET path` for a failure's diagnostics: the body, or why there is
    /// none (no answer within `HTTP_TIMEOUT` says something too).
    pub(crate) fn try_http_get(&self, path: &str) -> String {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.http_addr
        );
        let answer = (|| -> std::io::Result<String> {
            let mut stream = TcpStream::connect(self.http_addr)?;
            stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
            stream.write_all(request.as_bytes())?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok(response)
        })();
        match answer {
            Ok(response) => response
                .split_once("\r\n\r\n")
                .map_or(response.clone(), |(_, body)| body.to_string()),
            Err(error) => format!("(GET {path}: {error})"),
        }
    }

    /// Sends `request` on a new connection and reads the response to its end
    /// (every request says `Connection: close`): the status code and body.
    fn http(&self, request: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(self.http_addr).unwrap();
        stream.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
        let body = response
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_string());
        (status, body)
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
