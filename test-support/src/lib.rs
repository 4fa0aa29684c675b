//! Helpers for this project's own tests (not published).
//!
//! - [`ChildGuard`]: a child process that is killed and reaped when its guard drops, so a
//!   test that panics or returns early leaves nothing running. Children stay in the test's
//!   process group, so the runner's timeout kill (nextest kills the test's group) reaches
//!   them too.
//! - [`exit_with_parent`]: for a test binary that re-runs itself as a child, ends the child
//!   once its parent is gone, even if the parent was killed before its guards could run.
//! - [`wait_until`] / [`wait_for`]: wait for state reached asynchronously, with a deadline
//!   and a message that says what was awaited.
//! - [`run_single_test`], [`run_tests`]: the `main` of a `harness = false` test file,
//!   with libtest's command line (`--list`, filters, `--skip`, `--exact`), so any runner
//!   sees its tests.
//! - [`server_url`] / [`no_server`]: where the test servers are, and a loud failure when
//!   one is missing; [`postgres_url`] and, with the `postgres` feature, `postgres_pool`
//!   for the test PostgreSQL server.
//! - [`make_certificates`]: a private CA with server and client certificates, for TLS tests;
//!   [`TlsTerminator`]: `socat` terminating TLS (and verifying clients) in front of a server.
//! - [`servers`]: private `nats-server`s and `mosquitto`s, for restarts and server settings.
//! - [`proxy`]: a TCP fault proxy (lost replies, latency, partitions, silent connections).

pub mod proxy;
pub mod servers;

use std::future::Future;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// A running child process owned by a test: killed (SIGKILL) and reaped on drop.
///
/// ```no_run
/// use std::process::Command;
/// let mut sleeper = outbox_test_support::ChildGuard::spawn("sleeper", Command::new("sleep").arg("60"));
/// // ... the test panics here: the guard still kills `sleep` while unwinding.
/// sleeper.kill();
/// ```
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
}

impl ChildGuard {
    /// Spawns `command` (stdin from `/dev/null`), naming it in panics and logs.
    ///
    /// # Panics
    ///
    /// If the process cannot be started.
    pub fn spawn(name: impl Into<String>, command: &mut Command) -> Self {
        let name = name.into();
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {name}: {e}"));
        Self {
            name,
            child: Some(child),
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.running().id()
    }

    /// The child's stdout, if it was piped.
    pub fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.running_mut().stdout.take()
    }

    /// The exit status if the child has ended, without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let name = self.name.clone();
        self.running_mut()
            .try_wait()
            .unwrap_or_else(|e| panic!("could not poll {name}: {e}"))
    }

    /// Waits up to `limit` for the child to exit by itself.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends SIGKILL and reaps the child; returns how it ended.
    pub fn kill(&mut self) -> ExitStatus {
        let name = self.name.clone();
        let child = self.running_mut();
        let _ = child.kill(); // fails only if it already exited; `wait` tells
        child
            .wait()
            .unwrap_or_else(|e| panic!("could not reap {name}: {e}"))
    }

    /// Sends SIGTERM and waits up to `grace` for the child to exit, then kills it.
    /// Returns the exit status, or `None` when it had to be killed.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        let pid = self.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .is_ok_and(|s| s.success());
        if sent && let Some(status) = self.wait_timeout(grace) {
            return Some(status);
        }
        self.kill();
        None
    }

    fn running(&self) -> &Child {
        self.child.as_ref().expect("child process guard in use")
    }

    fn running_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("child process guard in use")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take()
            && child.try_wait().ok().flatten().is_none()
        {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("[test-support] killed {} (pid {})", self.name, child.id());
        }
    }
}

/// Whether a process with this id is running (a zombie, killed but not yet reaped, is not).
pub fn process_exists(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) state ...": the state follows the last ')'.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// In a child that a test started from its own binary: exits the process as soon as its
/// parent is gone (the parent was killed before its [`ChildGuard`] could run). Polls the
/// parent id from a background thread.
pub fn exit_with_parent() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                eprintln!("[test-support] parent {parent} is gone; child exits");
                std::process::exit(101);
            }
        }
    });
}

/// Waits until `check` returns true, polling every 20 ms; panics after `limit` with
/// `what` (which should say the state that was awaited).
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for(what, limit, || {
        let done = check();
        async move { done.await.then_some(()) }
    })
    .await
}

/// Waits until `check` returns `Some`, polling every 20 ms, and returns the value; panics
/// after `limit` with `what`. A check still running at the deadline counts as "not yet".
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        let remaining = limit.saturating_sub(start.elapsed());
        if let Ok(Some(value)) = tokio::time::timeout(remaining, check()).await {
            return value;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `main` of a `harness = false` test file that holds one test named `name`: parses
/// libtest's arguments (so `--list`, name filters, `--skip` and `--exact` work for cargo
/// test and nextest alike), runs `test` if selected, and exits with libtest's status.
pub fn run_single_test(name: &str, test: impl FnOnce() + Send + 'static) -> ! {
    run_tests(vec![(name.to_owned(), Box::new(test))])
}

/// [`run_single_test`] for a file that holds several tests, each a name and its body.
pub fn run_tests(tests: Vec<(String, Box<dyn FnOnce() + Send>)>) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let trials = tests
        .into_iter()
        .map(|(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}

/// A server URL from the environment variable `var`, or the default that
/// `scripts/services.sh` provides.
pub fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Fails the test, explaining which server is missing and how to start it.
pub fn no_server(what: &str, var: &str, url: &str, error: impl std::fmt::Display) -> ! {
    panic!(
        "{what} is not reachable at {url} ({error}).\n\
         These tests need a real {what}: run `scripts/services.sh` (it installs and starts it),\n\
         or point {var} at one. Use `scripts/test.sh` to start services and run everything."
    )
}

/// The variable naming the test PostgreSQL server.
pub const POSTGRES_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";

/// The test PostgreSQL server: `$OUTBOX_TEST_POSTGRES_URL`, or the database
/// `scripts/services.sh` creates.
pub fn postgres_url() -> String {
    server_url(POSTGRES_VAR, "postgres://postgres@127.0.0.1:5432/test")
}

/// A pool on the test PostgreSQL server; without one the test fails, saying how to
/// start it.
#[cfg(feature = "postgres")]
pub async fn postgres_pool() -> sqlx::PgPool {
    let url = postgres_url();
    sqlx::PgPool::connect(&url)
        .await
        .unwrap_or_else(|e| no_server("PostgreSQL", POSTGRES_VAR, &url, e))
}

/// Runs `command` to completion and returns its output; kills it and panics if it takes
/// longer than `limit`.
pub fn output_within(what: &str, limit: Duration, command: &mut Command) -> Output {
    let mut guard = ChildGuard::spawn(what, command.stdout(Stdio::piped()).stderr(Stdio::piped()));
    let stdout = drain(guard.running_mut().stdout.take());
    let stderr = drain(guard.running_mut().stderr.take());
    let Some(status) = guard.wait_timeout(limit) else {
        let pid = guard.id();
        guard.kill();
        panic!("{what} (pid {pid}) did not finish within {limit:?}; killed it");
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the
/// CA, as PEM files in `dir`: `ca.pem`, `server.pem` + `server.key`, `client.pem` +
/// `client.key` (keys in PKCS#8). Made with the `openssl` command.
pub fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (the openssl package) to make test certificates");
        assert!(status.success(), "openssl {args:?} failed");
    };
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=outbox test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    for name in ["server", "client"] {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let pem = format!("{name}.pem");
        let ext = format!("{name}.ext");
        let subject = format!("/CN={name}");
        openssl(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", &subject, "-keyout", &key, "-out",
            &csr,
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ]);
    }
}

/// `socat` listening with TLS on a free loopback port and forwarding to a plain TCP
/// server, with certificates from [`make_certificates`]: it requires a client certificate
/// signed by the same CA. Ends (and removes its certificates) when dropped.
#[derive(Debug)]
pub struct TlsTerminator {
    _child: ChildGuard,
    /// The TLS port on 127.0.0.1.
    pub port: u16,
    dir: std::path::PathBuf,
}

impl TlsTerminator {
    /// Starts `socat` in front of `upstream` (`host:port`) and waits until it listens.
    pub async fn start(upstream: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("outbox-tls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        make_certificates(&dir);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let file = |name: &str| dir.join(name).display().to_string();
        let listen = format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},cafile={},verify=1",
            file("server.pem"),
            file("server.key"),
            file("ca.pem")
        );
        let child = ChildGuard::spawn(
            "socat",
            Command::new("socat").args([listen, format!("TCP:{upstream}")]),
        );
        wait_until("socat to listen", Duration::from_secs(10), || async {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        Self {
            _child: child,
            port,
            dir,
        }
    }

    /// One of the files [`make_certificates`] made (`ca.pem`, `client.pem`, `client.key`).
    pub fn file(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }
}

impl Drop for TlsTerminator {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
