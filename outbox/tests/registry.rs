//! A scheme added from outside the front crate (this test registers `test://` sinks and a
//! `memory:` store), built from an `outbox.toml`; its sink wrapped in the test kit's
//! `FlakySink` and in every core layer; and the relay's deadline reaching the sink.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use outbox::config::RouteTable;
use outbox::layers::{CircuitConfig, RateLimit, SinkExt};
use outbox::registry::{BuildError, SinkDriver, StoreDriver};
use outbox::testkit::{FlakySink, RecordingSink};
use outbox::{
    AnyStore, Config, DynSink, Failure, FailureClass, MemoryStore, Message, NewMessage, Outbox,
    Outcome, PublishContext, Registry, Relay, Sink, Status,
};
use serde::Deserialize;

/// A sink of this test: records what it gets, after `delay` when the settings give one.
#[derive(Clone)]
struct TestSink {
    delay: Duration,
    got: RecordingSink,
    /// The deadline each call was given, as time left when the call started.
    deadlines: Arc<Mutex<Vec<Duration>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TestSettings {
    #[allow(dead_code)]
    url: String,
    #[serde(default, with = "outbox::duration::optional")]
    delay: Option<Duration>,
}

impl Sink for TestSink {
    async fn publish(
        &self,
        batch: &[Message],
        cx: &PublishContext,
    ) -> Result<Vec<Outcome>, Failure> {
        self.deadlines.lock().unwrap().push(cx.remaining());
        tokio::time::sleep(self.delay).await;
        self.got.publish(batch, cx).await
    }
}

/// The sinks the driver built, so the test can look inside.
fn built() -> &'static Mutex<Vec<TestSink>> {
    static BUILT: OnceLock<Mutex<Vec<TestSink>>> = OnceLock::new();
    BUILT.get_or_init(Mutex::default)
}

const TEST_SINKS: SinkDriver = SinkDriver {
    schemes: &["test"],
    build: |route| {
        Box::pin(async move {
            let settings: TestSettings = route.parse()?;
            let sink = TestSink {
                delay: settings.delay.unwrap_or_default(),
                got: RecordingSink::new(),
                deadlines: Arc::default(),
            };
            built().lock().unwrap().push(sink.clone());
            Ok(Arc::new(sink) as Arc<dyn DynSink>)
        })
    },
    check: |route| route.parse::<TestSettings>().map(drop),
};

/// One in-memory store shared by every `memory:` URL of this test process.
fn memory() -> &'static MemoryStore {
    static STORE: OnceLock<MemoryStore> = OnceLock::new();
    STORE.get_or_init(MemoryStore::new)
}

const MEMORY_STORE: StoreDriver = StoreDriver {
    schemes: &["memory"],
    connect: |settings| {
        Box::pin(async move {
            if settings.url != "memory:" {
                return Err(BuildError::config("only `memory:` is known"));
            }
            Ok(AnyStore::new(memory().clone()))
        })
    },
    schema: None,
};

fn registry() -> Registry {
    Registry::default()
        .with_sink(TEST_SINKS)
        .with_store(MEMORY_STORE)
}

fn message(destination: &str) -> NewMessage {
    NewMessage::builder(destination, "test.event")
        .json(&1)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheme_registered_outside_the_front_crate_is_built_from_config() {
    let config = Config::from_toml(
        "[store]\nurl = \"memory:\"\n[relay]\npublish_timeout = \"2s\"\n[routes.alerts]\nurl = \"test://alerts\"\n",
        std::iter::empty::<(&str, &str)>(),
    )
    .unwrap();
    let outbox = Outbox::from_config_with(&registry(), &config)
        .await
        .unwrap();
    assert_eq!(outbox.routes(), ["alerts"]);
    let id = memory().enqueue(message("alerts")).unwrap();
    assert_eq!(outbox.drain().await.unwrap().published, 1);
    assert_eq!(memory().row(id).unwrap().row.status(), Status::Published);
    let sink = built().lock().unwrap().last().cloned().unwrap();
    assert_eq!(sink.got.messages()[0].id, id);
    let given = sink.deadlines.lock().unwrap()[0];
    assert!(
        given <= Duration::from_secs(2) && given > Duration::from_secs(1),
        "the sink was told the relay's deadline: {given:?} left"
    );

    // The default registry does not know the scheme, and says so.
    let unknown = Outbox::from_config(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(unknown.contains("unsupported store URL"), "{unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_sink_wraps_in_flaky_sink_and_every_layer() {
    let route = RouteTable::new([("url", "test://payments".into())]);
    let configured = registry().build_sink("payments", &route).await.unwrap();
    let sink = FlakySink::new(configured)
        .permanent_when(|m| m.event_type == "poison")
        .rate_limited(RateLimit::per_second(1000.0).burst(100))
        .circuit_breaker(CircuitConfig::default())
        .concurrency_limit(2)
        .timeout(Duration::from_secs(5));
    let store = MemoryStore::new();
    let good: Vec<_> = (0..5)
        .map(|_| store.enqueue(message("payments")).unwrap())
        .collect();
    let poison = store
        .enqueue(
            NewMessage::builder("payments", "poison")
                .json(&1)
                .build()
                .unwrap(),
        )
        .unwrap();
    let relay = Relay::builder(store.clone())
        .route("payments", sink)
        .build()
        .unwrap();
    let report = relay.drain().await.unwrap();
    assert_eq!((report.published, report.dead), (5, 1));
    assert!(
        good.iter()
            .all(|id| store.row(*id).unwrap().row.status() == Status::Published)
    );
    assert_eq!(store.row(poison).unwrap().row.status(), Status::Dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_outlives_the_deadline_is_a_retryable_timeout_not_a_publish() {
    let route = RouteTable::new([("url", "test://slow".into()), ("delay", "30s".into())]);
    let slow = registry().build_sink("slow", &route).await.unwrap();
    let store = MemoryStore::new();
    let id = store.enqueue(message("slow")).unwrap();
    let relay = Relay::builder(store.clone())
        .route("slow", slow)
        .lease(Duration::from_secs(4))
        .publish_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let report = relay.run_once().await.unwrap();
    assert_eq!((report.published, report.retried), (0, 1));
    let row = store.row(id).unwrap().row;
    assert_eq!(row.status(), Status::Pending, "not marked published");
    let error = row.last_error.unwrap();
    assert!(error.contains("retryable timeout"), "{error}");

    // The same through a route timeout layer, tighter than the relay's.
    let route = RouteTable::new([
        ("url", "test://slow".into()),
        ("delay", "30s".into()),
        ("timeout", "200ms".into()),
    ]);
    let layered = registry().build_sink("slow", &route).await.unwrap();
    let outcomes = layered
        .publish(
            &[message("slow").into_message(chrono::Utc::now())],
            &PublishContext::default(),
        )
        .await
        .unwrap();
    match &outcomes[0] {
        Outcome::Failed(f) => assert!(f.retryable && f.class == FailureClass::Timeout, "{f}"),
        other => panic!("a timeout, not {other:?}"),
    }
}
