//! A private `nats-server` with JetStream (file storage) on a free port, for tests that
//! restart the server or need a configuration of their own (users, permissions, TLS).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::ChildGuard;

/// The `nats-server` binary: `$OUTBOX_TEST_NATS_SERVER`, else `nats-server` on the `PATH`
/// or in `/usr/sbin` (Debian's package puts it there).
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_TEST_NATS_SERVER") {
        return path.into();
    }
    let debian = Path::new("/usr/sbin/nats-server");
    if debian.exists() {
        return debian.to_owned();
    }
    "nats-server".into()
}

/// A `nats-server` the test owns: killed when dropped; its JetStream store outlives a
/// restart.
#[derive(Debug)]
pub struct NatsServer {
    /// `nats://127.0.0.1:PORT`.
    pub url: String,
    /// The port it listens on.
    pub port: u16,
    config: PathBuf,
    process: Option<ChildGuard>,
}

impl NatsServer {
    /// Starts a server in `dir` (its config and JetStream store live there) with `extra`
    /// appended to its configuration (an `authorization` block, say), and waits until
    /// it accepts connections.
    ///
    /// # Panics
    ///
    /// If the server does not start within 20 s; the message says how to install it.
    pub fn start(dir: &Path, extra: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let store = dir.join("jetstream");
        let config = dir.join("nats-server.conf");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?} }}\n{extra}\n",
                store.display().to_string()
            ),
        )
        .expect("write the nats-server config");
        let mut server = Self {
            url: format!("nats://127.0.0.1:{port}"),
            port,
            config,
            process: None,
        };
        server.restart();
        server
    }

    /// Kills the server (SIGKILL) and waits until its port is closed.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Starts the server again (after [`kill`](Self::kill)) with the same port and store.
    ///
    /// # Panics
    ///
    /// As for [`start`](Self::start).
    pub fn restart(&mut self) {
        self.kill();
        let binary = binary();
        let process = ChildGuard::spawn(
            "nats-server",
            Command::new(&binary)
                .arg("-c")
                .arg(&self.config)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        self.process = Some(process);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not accept connections on port {} within 20 s (install Debian's nats-server, or run scripts/services.sh)",
                binary.display(),
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
