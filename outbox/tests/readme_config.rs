//! The configuration shown in the README parses, and its HTTP route builds a sink.

#[test]
fn readme_config_parses() {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("# outbox.toml\n")
        .expect("README has the config example");
    let block = &readme[start..];
    let block = &block[..block.find("```").expect("code block ends")];
    let config = outbox::Config::from_toml(block, std::iter::empty::<(String, String)>())
        .expect("README config parses");
    assert_eq!(config.relay.concurrency, 2);
    assert_eq!(
        config.relay.ordering(),
        outbox::MessageOrder::PerKey(outbox::DeadHead::Skip)
    );
    assert_eq!(config.routes.len(), 2);
    assert_eq!(config.metrics.listen.as_deref(), Some("0.0.0.0:9464"));
}

#[cfg(feature = "http")]
#[tokio::test]
async fn readme_http_route_builds() {
    let mut settings = toml::Table::new();
    settings.insert("url".into(), "https://billing.example.com/hooks".into());
    settings.insert(
        "secrets".into(),
        toml::Value::Array(vec!["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()]),
    );
    let mut rate = toml::Table::new();
    rate.insert("per_second".into(), 80.into());
    rate.insert("burst".into(), 20.into());
    settings.insert("rate_limit".into(), toml::Value::Table(rate));
    outbox::build_sink("billing", &settings)
        .await
        .expect("sink builds");
    settings.insert("url".into(), "kafka://broker:9092".into());
    let err = outbox::build_sink("billing", &settings)
        .await
        .err()
        .expect("unknown scheme")
        .to_string();
    assert!(err.contains("unsupported sink URL"), "{err}");
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn a_scheme_whose_feature_is_off_names_the_feature() {
    let mut settings = toml::Table::new();
    settings.insert("url".into(), "redis://127.0.0.1:6379/".into());
    let err = outbox::build_sink("events", &settings)
        .await
        .err()
        .expect("feature off")
        .to_string();
    assert!(err.contains("`redis` feature"), "{err}");
}
