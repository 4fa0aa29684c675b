//! No error about a store or route URL repeats a path segment, a query value or the
//! password of that URL: errors show the scheme, host and port, and the names of query
//! keys. Generated URLs carry generated secrets in every such place, for every scheme the
//! front crate knows and for misspelt ones, and each is read the ways a relay reads it:
//! a route's sink built by the registry, a store opened, a store's schema printed.

use std::time::Duration;

use outbox::config::RouteTable;
use outbox::{Registry, StoreSettings};
use proptest::prelude::*;

const SCHEMES: &[&str] = &[
    "http",
    "https",
    "htps",
    "redis",
    "rediss",
    "amqp",
    "amqps",
    "kafka",
    "sqs",
    "sqs+https",
    "nats",
    "nats+tls",
    "mqtt",
    "mqtts",
    "postgres",
    "postgresql",
    "mysql",
    "sqlite",
    "gopher",
];

/// A secret: long enough and odd enough that only a leak can put it in a message.
fn secret() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_~-]{10,20}".prop_map(|s| format!("Zq{s}"))
}

/// A URL with secrets in the password (when it has one), every path segment and every
/// query value, and the secrets themselves.
fn url() -> impl Strategy<Value = (String, Vec<String>)> {
    (
        prop::sample::select(SCHEMES),
        secret(),
        prop::collection::vec(secret(), 0..4),
        prop::collection::vec(("[a-z_]{1,12}", secret()), 0..4),
        prop::bool::ANY,
    )
        .prop_map(|(scheme, password, segments, query, with_password)| {
            // Port 1: nothing listens, so what a server would answer is not in question.
            let user = if with_password {
                format!("relay:{password}@")
            } else {
                String::new()
            };
            let mut url = format!("{scheme}://{user}127.0.0.1:1/");
            url.push_str(&segments.join("/"));
            if !query.is_empty() {
                let pairs: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
                url.push('?');
                url.push_str(&pairs.join("&"));
            }
            let mut secrets = vec![password];
            secrets.extend(segments);
            secrets.extend(query.into_iter().map(|(_, v)| v));
            (url, secrets)
        })
}

/// Every error a relay could report about `url`, as text (`Display` and `Debug`).
async fn errors_about(url: &str) -> Vec<String> {
    // `rediss://` and `amqps://` routes need a TLS provider, as in the CLI.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let registry = Registry::default();
    let mut errors = Vec::new();
    let table = RouteTable::new([("url", serde_json::Value::String(url.to_owned()))]);
    match tokio::time::timeout(Duration::from_secs(20), registry.build_sink("r", &table)).await {
        Ok(Err(error)) => errors.push(format!("{error} / {error:?}")),
        Ok(Ok(_)) => {}
        Err(_) => panic!("building a sink from {url:?} took over 20 s"),
    }
    let settings = StoreSettings::new(url);
    if let Err(error) = registry.store_schema(&settings) {
        errors.push(format!("{error} / {error:?}"));
    }
    // Opening SQLite would create a file named by the path: the schema covers its parsing.
    if !url.starts_with("sqlite") {
        match tokio::time::timeout(Duration::from_secs(10), registry.connect_store(&settings)).await
        {
            Ok(Err(error)) => errors.push(format!("{error} / {error:?}")),
            Ok(Ok(_)) => {}
            Err(_) => panic!("opening a store at {url:?} took over 10 s"),
        }
    }
    errors
}

proptest! {
    // Each case may wait for a connection attempt (Kafka's start-up takes its 5 s).
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn errors_never_repeat_a_path_segment_a_query_value_or_a_password((url, secrets) in url()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let errors = runtime.block_on(errors_about(&url));
        for error in &errors {
            for secret in &secrets {
                prop_assert!(
                    !error.contains(secret.as_str()),
                    "{secret:?} of {url:?} leaked: {error}"
                );
            }
        }
    }
}

/// The test can fail: a URL the registry refuses does produce an error, and that error
/// names where the URL points.
#[tokio::test]
async fn the_errors_it_reads_name_where_the_url_points() {
    let errors =
        errors_about("htps://relay:Zqpassword@127.0.0.1:1/T0/B0/Zqtoken?channel=Zqvalue").await;
    assert!(!errors.is_empty());
    assert!(
        errors[0].contains("htps://***@127.0.0.1:1/…?channel=…"),
        "{errors:?}"
    );
}
