//! Private servers on free ports for tests that restart a server or need a configuration
//! of their own (users, permissions, JetStream): `nats-server` and `mosquitto`, from
//! Debian's packages (`scripts/services.sh` installs them).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ChildGuard;

/// A server process the test owns: killed when dropped; what it keeps on disk (in the
/// directory it was started in) outlives a [`restart`](Self::restart).
#[derive(Debug)]
pub struct PrivateServer {
    /// `nats://127.0.0.1:PORT` or `mqtt://127.0.0.1:PORT`.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    binary: PathBuf,
    args: Vec<OsString>,
    process: Option<ChildGuard>,
}

impl PrivateServer {
    /// A `nats-server` (`$OUTBOX_TEST_NATS_SERVER`, default `/usr/sbin/nats-server`) with
    /// JetStream storing in `dir`, and `extra` appended to its configuration (an
    /// `authorization` block, say).
    ///
    /// # Panics
    ///
    /// If the server does not accept connections within 20 s.
    pub fn nats(dir: &Path, extra: &str) -> Self {
        let port = free_port();
        let config = dir.join("nats-server.conf");
        let store = dir.join("jetstream").display().to_string();
        std::fs::write(
            &config,
            format!("listen: 127.0.0.1:{port}\njetstream {{ store_dir: {store:?} }}\n{extra}\n"),
        )
        .expect("write the nats-server config");
        Self::start(
            format!("nats://127.0.0.1:{port}"),
            port,
            binary("OUTBOX_TEST_NATS_SERVER", "/usr/sbin/nats-server"),
            vec!["-c".into(), config.into()],
        )
    }

    /// A `mosquitto` (`$OUTBOX_TEST_MOSQUITTO`, default `/usr/sbin/mosquitto`) with
    /// persistence in `dir`, anonymous clients allowed and room for a million messages queued
    /// for a subscriber, unless `extra` (appended to its configuration) says otherwise.
    /// (By default mosquitto drops the QoS 1 messages queued beyond 1,000 for a subscriber
    /// that falls behind: a test that counts what a subscriber got must not meet that.)
    ///
    /// # Panics
    ///
    /// If the broker does not accept connections within 20 s.
    pub fn mosquitto(dir: &Path, extra: &str) -> Self {
        let port = free_port();
        let config = dir.join("mosquitto.conf");
        let default = |key: &str, line: &'static str| if extra.contains(key) { "" } else { line };
        let anonymous = default("allow_anonymous", "allow_anonymous true\n");
        let queue = default("max_queued_messages", "max_queued_messages 1000000\n");
        std::fs::write(
            &config,
            format!(
                "listener {port} 127.0.0.1\npersistence true\npersistence_location {}/\n\
                 user {}\n{anonymous}{queue}{extra}\n",
                dir.display(),
                // As root, mosquitto would switch to its own user, who cannot write `dir`.
                std::env::var("USER").unwrap_or_else(|_| "root".to_owned()),
            ),
        )
        .expect("write the mosquitto config");
        Self::start(
            format!("mqtt://127.0.0.1:{port}"),
            port,
            binary("OUTBOX_TEST_MOSQUITTO", "/usr/sbin/mosquitto"),
            vec!["-c".into(), config.into()],
        )
    }

    fn start(url: String, port: u16, binary: PathBuf, args: Vec<OsString>) -> Self {
        let mut server = Self {
            url,
            port,
            binary,
            args,
            process: None,
        };
        server.restart();
        server
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Stops the server cleanly (SIGTERM, then SIGKILL after 10 s) and reaps it: what it
    /// writes on shutdown (mosquitto's persistence file) is written.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.terminate(Duration::from_secs(10));
        }
    }

    /// Starts the server again (after [`kill`](Self::kill)) on the same port and files.
    ///
    /// # Panics
    ///
    /// If it does not accept connections within 20 s.
    pub fn restart(&mut self) {
        self.kill();
        let name = self.binary.display().to_string();
        self.process = Some(ChildGuard::spawn(
            name.clone(),
            Command::new(&self.binary)
                .args(&self.args)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        ));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{name} did not accept connections on port {} within 20 s (scripts/services.sh installs it)",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `$var`, else `default` when it exists, else the bare name for the `PATH` to find.
fn binary(var: &str, default: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return path.into();
    }
    let default = Path::new(default);
    if default.exists() {
        return default.to_owned();
    }
    default.file_name().map(PathBuf::from).unwrap_or_default()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
