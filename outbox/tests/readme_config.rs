//! The configuration shown in the README parses, and its routes build sinks through the
//! registry, the README's policies included.

use outbox::Registry;
use outbox::config::RouteTable;

fn readme_config() -> outbox::Config {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("# outbox.toml\n")
        .expect("README has the config example");
    let block = &readme[start..];
    let block = &block[..block.find("```").expect("code block ends")];
    outbox::Config::from_toml(block, std::iter::empty::<(String, String)>())
        .expect("README config parses")
}

/// The README's route `route`, parsed as the settings of its sink.
#[cfg(any(
    feature = "amqp",
    feature = "kafka",
    feature = "sqs",
    feature = "nats",
    feature = "mqtt"
))]
fn readme_route<T: serde::de::DeserializeOwned>(route: &str) -> T {
    readme_config().routes[route]
        .sink_settings(route)
        .parse()
        .unwrap_or_else(|e| panic!("the {route} route parses: {e}"))
}

/// The registry's error for route `name`, which builds no sink.
#[cfg(any(feature = "http", not(feature = "redis")))]
async fn build_error(name: &str, route: &RouteTable) -> String {
    Registry::default()
        .build_sink(name, route)
        .await
        .err()
        .expect("no sink for this route")
        .to_string()
}

#[test]
fn readme_config_parses() {
    let config = readme_config();
    assert_eq!(config.relay.concurrency, Some(2));
    assert_eq!(
        config.relay.order(),
        Some(outbox::MessageOrder::PerKey(outbox::DeadHead::Skip))
    );
    assert_eq!(config.routes.len(), 7);
    assert_eq!(config.metrics.listen.as_deref(), Some("0.0.0.0:9464"));
    let policy = config.routes["billing"].policy("billing").unwrap();
    assert_eq!(policy.rate_limit.map(|r| r.burst), Some(20));
}

#[cfg(feature = "http")]
#[tokio::test]
async fn readme_http_route_builds() {
    let config = readme_config();
    Registry::default()
        .build_sink("billing", &config.routes["billing"])
        .await
        .expect("sink builds");
    let unknown = RouteTable::new([("url", "zeromq://broker:5555".into())]);
    let err = build_error("billing", &unknown).await;
    assert!(err.contains("unsupported sink URL"), "{err}");
}

#[cfg(feature = "amqp")]
#[test]
fn readme_amqp_route_is_a_valid_amqp_config() {
    let amqp: outbox::amqp::AmqpSinkConfig = readme_route("ledger");
    assert_eq!(amqp.exchange, "billing");
    assert_eq!(amqp.routing_key, "{tenant_id}.{event_type}");
    amqp.validate().expect("and validates");
}

#[cfg(feature = "kafka")]
#[test]
fn readme_kafka_route_is_a_valid_kafka_config() {
    let kafka: outbox::kafka::KafkaSinkConfig = readme_route("invoices");
    assert_eq!(kafka.unkeyed, Some(outbox::kafka::Unkeyed::Id));
    assert_eq!(kafka.properties["compression.type"], "lz4");
    kafka.validate().expect("and validates");
}

#[cfg(feature = "sqs")]
#[test]
fn readme_sqs_route_is_a_valid_sqs_config() {
    let sqs: outbox::sqs::SqsSinkConfig = readme_route("payments");
    assert_eq!(sqs.default_group.as_deref(), Some("payments"));
    assert_eq!(sqs.binary, Some(outbox::sqs::Binary::Base64));
    sqs.validate().expect("and validates");
}

#[cfg(feature = "nats")]
#[test]
fn readme_nats_route_is_a_valid_nats_config() {
    let nats: outbox::nats::NatsSinkConfig = readme_route("shipping");
    assert_eq!(nats.subject, "shipping.{partition_key}");
    nats.validate().expect("and validates");
}

#[cfg(feature = "mqtt")]
#[test]
fn readme_mqtt_route_is_a_valid_mqtt_config() {
    let mqtt: outbox::mqtt::MqttSinkConfig = readme_route("devices");
    assert_eq!(mqtt.topic, "devices/{partition_key}/{event_type}");
    assert_eq!(mqtt.protocol, outbox::mqtt::Protocol::V5);
    mqtt.validate().expect("and validates");
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn a_scheme_whose_feature_is_off_names_the_feature() {
    let redis = RouteTable::new([("url", "redis://127.0.0.1:6379/".into())]);
    let err = build_error("events", &redis).await;
    assert!(err.contains("`redis` feature"), "{err}");
}
