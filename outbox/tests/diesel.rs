//! A diesel application names its relay store by URL (`diesel+sqlite:PATH`): the front
//! crate opens the sqlx store of that database, and a relay built on it drains what a
//! diesel transaction enqueued on the application's own connection.

use diesel::Connection;
use outbox::diesel::sqlite::SqliteOutbox as DieselWriter;
use outbox::sqlite::SqliteOutbox;
use outbox::{Config, NewMessage, Outbox};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diesel_url_opens_the_stores_relay_on_what_diesel_wrote() {
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
        .expect("the store builds from its diesel+ URL");
    assert!(
        store.downcast_ref::<SqliteOutbox>().is_some(),
        "diesel+sqlite: opens the SQLite relay store"
    );

    let message = NewMessage::builder("billing", "invoice.paid")
        .json(&7)
        .build()
        .unwrap();
    let id = message.id();
    let file = path.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = diesel::SqliteConnection::establish(file.to_str().unwrap()).unwrap();
        let writer = DieselWriter::new();
        writer.migrate(&mut conn).expect("diesel migrates");
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
