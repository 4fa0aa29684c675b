//! A configuration names a diesel store by URL (`diesel+sqlite:PATH`): the front crate
//! builds it through the registry, migrates it, and a relay built from the same
//! configuration drains what a diesel transaction enqueued.

use outbox::diesel::sqlite::SqliteOutbox;
use outbox::{Config, NewMessage, Outbox};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diesel_store_is_built_from_its_url() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outbox.db");
    let config = Config::from_toml(
        &format!("[store]\nurl = \"diesel+sqlite:{}\"\n", path.display()),
        std::iter::empty::<(String, String)>(),
    )
    .unwrap();
    let store = outbox::Registry::default()
        .connect_store(&config.store)
        .await
        .expect("the diesel store builds from its URL");
    outbox::Backend::migrate(&store).await.expect("migrate");
    let diesel_store = store
        .downcast_ref::<SqliteOutbox>()
        .expect("a diesel SQLite store")
        .clone();

    let message = NewMessage::builder("billing", "invoice.paid")
        .json(&7)
        .build()
        .unwrap();
    let id = message.id();
    let writer = diesel_store.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = writer.pool().get().unwrap();
        conn.immediate_transaction(|conn| {
            writer.enqueue(conn, &message).unwrap();
            Ok::<_, diesel::result::Error>(())
        })
        .unwrap();
    })
    .await
    .unwrap();

    let sink = outbox::testkit::RecordingSink::new();
    let outbox = Outbox::builder_any(store)
        .route("billing", sink.clone())
        .build()
        .await
        .unwrap();
    assert_eq!(outbox.drain().await.unwrap().published, 1);
    assert_eq!(sink.messages()[0].id, id);

    let missing = Config::from_toml(
        "[store]\nurl = \"diesel+sqlite:\"\n",
        std::iter::empty::<(String, String)>(),
    )
    .unwrap();
    let error = outbox::Registry::default()
        .connect_store(&missing.store)
        .await
        .expect_err("no path, no store")
        .to_string();
    assert!(error.contains("file path"), "{error}");
}
