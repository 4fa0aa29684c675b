//! `outbox relay` exports its spans over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! names a collector, and runs as before without it. A fake collector in the test takes
//! the requests; the relay publishes from SQLite to a webhook receiver in the test.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::NewMessage;
use outbox::sqlite::SqliteOutbox;
use outbox_test_support::{ChildGuard, wait_until};

mod common;

/// The `outbox` binary with none of the test's own logging or OpenTelemetry settings.
fn outbox() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .env_remove("OUTBOX_CONFIG")
        .env_remove("OUTBOX_LOG_FORMAT")
        .env_remove("OUTBOX_OTEL_FILTER")
        .env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("OTEL_")) {
            command.env_remove(name);
        }
    }
    command
}

/// The trace the test's messages were enqueued in: the relay's publish span links to it.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One request a fake collector took.
#[derive(Debug, Clone)]
struct Request {
    content_type: String,
    body: Vec<u8>,
    /// Whether it was answered 200 (else 500).
    ok: bool,
}

/// A fake OTLP/HTTP collector: keeps every `POST /v1/traces` and answers 200 while
/// healthy, 500 otherwise.
#[derive(Clone)]
struct Collector {
    endpoint: String,
    requests: Arc<Mutex<Vec<Request>>>,
    healthy: Arc<AtomicBool>,
}

impl Collector {
    async fn start(healthy: bool) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let healthy = Arc::new(AtomicBool::new(healthy));
        let (kept, answer) = (requests.clone(), healthy.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (kept, answer) = (kept.clone(), answer.clone());
                    async move {
                        let ok = answer.load(Ordering::SeqCst);
                        let content_type = headers
                            .get(axum::http::header::CONTENT_TYPE)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        kept.lock().unwrap().push(Request {
                            content_type,
                            body: body.to_vec(),
                            ok,
                        });
                        if ok {
                            axum::http::StatusCode::OK
                        } else {
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR
                        }
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            endpoint,
            requests,
            healthy,
        }
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// A migrated SQLite outbox, a config with one route to the test's receiver, and the
/// count of deliveries.
struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
    outbox: SqliteOutbox,
    delivered: Arc<std::sync::atomic::AtomicU64>,
}

impl Setup {
    async fn new() -> Self {
        let (hook, delivered) = common::counting_receiver().await;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("outbox.db");
        let config = dir.path().join("outbox.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"sqlite:{}\"\n\n[relay]\npoll_interval = \"100ms\"\n\n\
                 [routes.hooks]\nurl = \"{hook}\"\nallow = [\"127.0.0.1/32\"]\n",
                db.display()
            ),
        )
        .unwrap();
        let migrated = outbox_test_support::output_within(
            "outbox migrate",
            Duration::from_secs(60),
            outbox().args(["--config", config.to_str().unwrap(), "migrate"]),
        );
        assert!(
            migrated.status.success(),
            "{}",
            String::from_utf8_lossy(&migrated.stderr)
        );
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        Self {
            dir,
            config,
            outbox: SqliteOutbox::new(pool),
            delivered,
        }
    }

    /// Enqueues one message for the route, enqueued in the trace [`TRACE_ID`], and waits
    /// until the receiver has it.
    async fn deliver_one(&self) {
        let before = self.delivered.load(Ordering::SeqCst);
        let message = NewMessage::builder("hooks", "order.paid")
            .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
            .json(&before)
            .build()
            .unwrap();
        let mut conn = self.outbox.pool().acquire().await.unwrap();
        self.outbox.enqueue(&mut conn, &message).await.unwrap();
        drop(conn);
        wait_until(
            "the receiver to get the message",
            Duration::from_secs(30),
            || async { self.delivered.load(Ordering::SeqCst) > before },
        )
        .await;
    }

    /// Starts `outbox relay` with `env`, its stderr in the file `log`.
    fn relay(&self, env: &[(&str, &str)], log: &str) -> ChildGuard {
        ChildGuard::spawn(
            "outbox relay",
            outbox()
                .args(["--config", self.config.to_str().unwrap(), "relay"])
                .envs(env.iter().copied())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(self.dir.path().join(log)).unwrap()),
        )
    }

    fn log(&self, log: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default()
    }
}

/// Whether process `pid` runs the OpenTelemetry SDK's export thread
/// (`OpenTelemetry.Traces.BatchProcessor`, which Linux cuts to 15 bytes).
fn runs_an_exporter(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .any(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with("OpenTelemetry"))
        })
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn stops_gracefully(relay: &mut ChildGuard) {
    let status = relay.terminate(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "graceful stop, exit 0: {status:?}"
    );
}

/// Without the variable the relay delivers as before and starts no exporter; with it,
/// the batch and publish spans reach the collector as OTLP protobuf under the service
/// name `outbox-relay`, the publish linked to the message's trace. The export timer is set
/// beyond the test, so the spans can only arrive through the flush at exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_spans_reach_the_collector_the_environment_names() {
    let collector = Collector::start(true).await;
    let setup = Setup::new().await;

    let mut relay = setup.relay(&[], "plain.log");
    setup.deliver_one().await;
    assert!(
        !runs_an_exporter(relay.id()),
        "no exporter without OTEL_EXPORTER_OTLP_ENDPOINT"
    );
    stops_gracefully(&mut relay);
    assert_eq!(collector.requests().len(), 0, "nothing sent to a collector");

    let mut relay = setup.relay(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
        "traced.log",
    );
    setup.deliver_one().await;
    assert!(runs_an_exporter(relay.id()), "an exporter thread");
    assert_eq!(
        collector.requests().len(),
        0,
        "nothing exported before the timer or the exit"
    );
    stops_gracefully(&mut relay);
    let requests = collector.requests();
    assert!(!requests.is_empty(), "the spans are flushed at exit");
    for request in &requests {
        assert_eq!(request.content_type, "application/x-protobuf");
    }
    let bodies: Vec<u8> = requests.iter().flat_map(|r| r.body.clone()).collect();
    for needle in ["outbox_batch", "outbox_publish", "outbox-relay"] {
        assert!(
            contains(&bodies, needle),
            "{needle:?} in the exported spans"
        );
    }
    let trace_id: Vec<u8> = (0..TRACE_ID.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&TRACE_ID[i..i + 2], 16).unwrap())
        .collect();
    assert!(
        bodies.windows(trace_id.len()).any(|w| w == trace_id),
        "a link to the message's trace"
    );
    let log = setup.log("traced.log");
    assert!(!log.contains("trace export"), "{log}");
}

/// A collector that fails is said once on stderr, however many exports fail, and once
/// more when it takes spans again; the relay goes on delivering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_collector_is_logged_once_and_its_recovery_once() {
    let collector = Collector::start(false).await;
    let setup = Setup::new().await;
    let mut relay = setup.relay(
        &[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                &format!("{}/v1/traces", collector.endpoint),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
        "relay.log",
    );
    for _ in 0..3 {
        let before = collector.requests().len();
        setup.deliver_one().await;
        wait_until(
            "an export of the batch's spans",
            Duration::from_secs(30),
            || async { collector.requests().len() > before },
        )
        .await;
    }
    collector.healthy.store(true, Ordering::SeqCst);
    setup.deliver_one().await;
    wait_until(
        "an export the collector takes",
        Duration::from_secs(30),
        || async { collector.requests().iter().any(|r| r.ok) },
    )
    .await;
    stops_gracefully(&mut relay);
    let failed = collector.requests().iter().filter(|r| !r.ok).count();
    assert!(failed >= 3, "{failed} failed exports");
    let log = setup.log("relay.log");
    let lines = |text: &str| log.lines().filter(|l| l.contains(text)).count();
    assert_eq!(lines("trace export failing"), 1, "{log}");
    assert_eq!(lines("trace export recovered"), 1, "{log}");
}

/// A collector that takes the connection and never answers holds the exit for a few
/// seconds, not for the export timeout (a minute here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_collector_does_not_hold_the_exit() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    let setup = Setup::new().await;
    let mut relay = setup.relay(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
        "relay.log",
    );
    setup.deliver_one().await;
    let started = std::time::Instant::now();
    stops_gracefully(&mut relay);
    eprintln!("the relay stopped in {:.1?}", started.elapsed());
    assert!(
        accepted.load(Ordering::SeqCst) > 0,
        "the exit tried to send the spans"
    );
    let log = setup.log("relay.log");
    assert!(log.contains("spans still queued are dropped"), "{log}");
}

/// A malformed OpenTelemetry variable is a one-line error naming it (never showing a
/// header's value), and only when an endpoint turns the export on (and neither
/// `OTEL_TRACES_EXPORTER=none` nor `OTEL_SDK_DISABLED=true` turns it off).
#[test]
fn malformed_otel_variables_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("unused.db").display());
    let run = |vars: &[(&str, &str)]| {
        outbox_test_support::output_within(
            "outbox migrate --print",
            Duration::from_secs(30),
            outbox()
                .args(["--store", &store, "migrate", "--print"])
                .envs(vars.iter().copied()),
        )
    };
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            &[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://")],
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ),
        (
            &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            &[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "10s")],
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        ),
        (
            &[
                endpoint,
                ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,x-api-key hunter2"),
            ],
            "OTEL_EXPORTER_OTLP_HEADERS",
        ),
        (
            &[endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")],
            "OTEL_TRACES_SAMPLER",
        ),
        (
            &[
                endpoint,
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            "OTEL_TRACES_SAMPLER_ARG",
        ),
        (
            &[endpoint, ("OUTBOX_OTEL_FILTER", "outbox=loud")],
            "OUTBOX_OTEL_FILTER",
        ),
        (
            &[endpoint, ("OTEL_TRACES_EXPORTER", "zipkin")],
            "OTEL_TRACES_EXPORTER",
        ),
    ];
    let mut wrong = Vec::new();
    for (vars, named) in cases {
        let out = run(vars);
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success()
            || !err.starts_with(&format!("error: {named}: "))
            || err.lines().count() != 1
            || err.contains("hunter2")
        {
            wrong.push(format!("{vars:?} → {:?} {err:?}", out.status.code()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    let valid = run(&[
        endpoint,
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-api-key=hunter2, x-tenant=a%20b",
        ),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
        ("OTEL_TRACES_SAMPLER", "traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ("OUTBOX_OTEL_FILTER", "outbox=debug"),
    ]);
    assert!(
        valid.status.success(),
        "{}",
        String::from_utf8_lossy(&valid.stderr)
    );
    let grpc = ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
    for off in [
        &[grpc][..],
        &[endpoint, grpc, ("OTEL_TRACES_EXPORTER", "none")],
        &[endpoint, grpc, ("OTEL_SDK_DISABLED", "true")],
    ] {
        let out = run(off);
        assert!(
            out.status.success(),
            "{off:?}: export off, nothing else read: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
