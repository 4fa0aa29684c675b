//! The receiver toolkit behind a real axum server, fed by the real sink.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::routing::post;
use common::{OLD_SECRET, SECRET};
use outbox_engine::Message;
use outbox_engine::testkit::MemoryInbox;
use outbox_engine::testkit::publish;
use outbox_engine::{Delivery, FailureClass, Inbox, NewMessage, Outcome};
use outbox_receiver::{ReceiveError, WebhookReceiver, WebhookRequest};
use outbox_sink_http::{HttpSink, HttpSinkConfig};
use tokio::net::TcpListener;

#[derive(Clone)]
struct App {
    receiver: WebhookReceiver,
    inbox: MemoryInbox,
    effects: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl FromRef<App> for WebhookReceiver {
    fn from_ref(app: &App) -> Self {
        app.receiver.clone()
    }
}

async fn hook(State(app): State<App>, request: WebhookRequest) -> Result<StatusCode, ReceiveError> {
    let mut tx = app.inbox.begin();
    let receipt = app
        .receiver
        .record(&app.inbox, &mut tx, request.webhook)
        .await?;
    if receipt.is_new() {
        app.effects.fetch_add(1, Ordering::SeqCst);
        app.bodies.lock().unwrap().push(request.body.to_vec());
    }
    tx.commit();
    Ok(StatusCode::NO_CONTENT)
}

async fn start(receiver: WebhookReceiver) -> (SocketAddr, App) {
    let app = App {
        receiver,
        inbox: MemoryInbox::new(),
        effects: Arc::default(),
        bodies: Arc::default(),
    };
    let router = Router::new()
        .route("/hook", post(hook))
        .with_state(app.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (addr, app)
}

fn sink(addr: SocketAddr, route: impl Fn(HttpSinkConfig) -> HttpSinkConfig) -> HttpSink {
    common::sink(format!("http://{addr}/hook"), route)
}

fn failure(outcome: &Outcome) -> &outbox_engine::Failure {
    match outcome {
        Outcome::Failed(f) => f,
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// A claimed-form JSON message for `destination`.
fn message(destination: &str, n: u64) -> Message {
    NewMessage::builder(destination, "test.event")
        .json(&n)
        .build()
        .unwrap()
        .into_message(chrono::Utc::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_deliveries_run_once_and_duplicates_are_acknowledged() {
    let receiver = WebhookReceiver::from_secrets([OLD_SECRET, SECRET])
        .unwrap()
        .consumer("billing");
    let (addr, app) = start(receiver).await;
    // The receiver holds both secrets during a rotation; the sender signs with the new.
    let sink = sink(addr, |e| e.secret(SECRET));
    let m = message("hook", 1);
    for _ in 0..3 {
        let outcomes = publish(&sink, std::slice::from_ref(&m)).await;
        assert_eq!(outcomes, [Outcome::published_with("HTTP 204")]);
    }
    assert_eq!(app.effects.load(Ordering::SeqCst), 1);
    assert_eq!(app.bodies.lock().unwrap()[0], m.payload);
    assert_eq!(app.inbox.len(), 1, "one record for three deliveries");
    let mut tx = app.inbox.begin();
    assert_eq!(
        app.inbox
            .record(&mut tx, "billing", &m.idempotency_key)
            .await
            .unwrap(),
        Delivery::Duplicate,
        "the record is the signed idempotency key under the receiver's consumer name"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_dots_is_signed_verified_and_recorded_as_written() {
    let (addr, app) = start(
        WebhookReceiver::from_secrets([SECRET])
            .unwrap()
            .consumer("crm"),
    )
    .await;
    let sink = sink(addr, |e| e.secret(SECRET));
    let m = NewMessage::builder("hook", "order.paid")
        .json(&42)
        .idempotency_key("order-42.paid")
        .build()
        .unwrap()
        .into_message(chrono::Utc::now());
    for _ in 0..2 {
        let outcomes = publish(&sink, std::slice::from_ref(&m)).await;
        assert_eq!(outcomes, [Outcome::published_with("HTTP 204")]);
    }
    assert_eq!(app.effects.load(Ordering::SeqCst), 1, "applied once");
    let mut tx = app.inbox.begin();
    assert_eq!(
        app.inbox
            .record(&mut tx, "crm", "order-42.paid")
            .await
            .unwrap(),
        Delivery::Duplicate,
        "the inbox holds the key as the application wrote it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_signatures_are_refused_and_dead_letter_at_the_sender() {
    let (addr, app) = start(WebhookReceiver::from_secrets([SECRET]).unwrap()).await;
    let wrong = sink(addr, |e| e.secret(OLD_SECRET));
    let f = failure(&publish(&wrong, &[message("hook", 1)]).await[0]).clone();
    assert_eq!(
        (f.class, f.retryable),
        (FailureClass::Rejected, false),
        "{f}"
    );
    assert!(f.message.starts_with("HTTP 401"), "{f}");
    assert!(f.message.contains("no matching webhook signature"), "{f}");

    let unsigned = sink(addr, |e| e);
    let f = failure(&publish(&unsigned, &[message("hook", 2)]).await[0]).clone();
    assert!(f.message.contains("missing `webhook-id` header"), "{f}");
    assert_eq!(app.effects.load(Ordering::SeqCst), 0);
    assert!(app.inbox.is_empty(), "nothing unverified reaches the inbox");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused_as_too_large() {
    let receiver = WebhookReceiver::from_secrets([SECRET])
        .unwrap()
        .max_body(64);
    let (addr, app) = start(receiver).await;
    let sink = sink(addr, |e| e.secret(SECRET));
    let big = NewMessage::builder("hook", "e")
        .bytes(vec![b'x'; 65], "text/plain")
        .build()
        .unwrap()
        .into_message(chrono::Utc::now());
    let fits = NewMessage::builder("hook", "e")
        .bytes(vec![b'x'; 64], "text/plain")
        .build()
        .unwrap()
        .into_message(chrono::Utc::now());
    let outcomes = publish(&sink, &[big, fits]).await;
    let f = failure(&outcomes[0]);
    assert_eq!(
        (f.class, f.retryable),
        (FailureClass::TooLarge, false),
        "{f}"
    );
    assert!(outcomes[1].is_published());
    assert_eq!(app.effects.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn receive_verifies_before_recording() {
    let receiver = WebhookReceiver::from_secrets([SECRET]).unwrap();
    let inbox = MemoryInbox::new();
    let mut tx = inbox.begin();
    let mut headers = http::HeaderMap::new();
    headers.insert("webhook-id", "k1".parse().unwrap());
    headers.insert(
        "webhook-timestamp",
        chrono::Utc::now().timestamp().to_string().parse().unwrap(),
    );
    headers.insert(
        "webhook-signature",
        "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
            .parse()
            .unwrap(),
    );
    let err = receiver
        .receive(&inbox, &mut tx, &headers, b"{}")
        .await
        .unwrap_err();
    assert_eq!(err.status(), StatusCode::UNAUTHORIZED);
    tx.commit();
    assert!(inbox.is_empty(), "a refused request records nothing");
    let mut tx = inbox.begin();

    let secret = outbox_engine::webhooks::Secret::parse(SECRET).unwrap();
    let ts = chrono::Utc::now().timestamp();
    let signature = outbox_engine::webhooks::signature_header(&[secret], "k1", ts, b"{}");
    headers.insert("webhook-timestamp", ts.to_string().parse().unwrap());
    headers.insert("webhook-signature", signature.parse().unwrap());
    headers.insert("outbox-attempt", "2".parse().unwrap());
    let first = receiver
        .receive(&inbox, &mut tx, &headers, b"{}")
        .await
        .unwrap();
    assert!(first.is_new());
    assert_eq!(first.webhook().attempt, Some(2));
    let again = receiver
        .receive(&inbox, &mut tx, &headers, b"{}")
        .await
        .unwrap();
    assert!(!again.is_new());
    assert_eq!(receiver.consumer_name(), "webhooks");
}
