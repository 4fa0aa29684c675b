//! A route URL as each sink reads it, and as logs print it. Nothing may panic; no error,
//! configuration or redacted form may repeat the URL's password, and no error or
//! redacted form a path segment or a query value (a configuration shows the options it
//! read from the query, which is what it is for).
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_engine::redact;
use outbox_fuzz::{assert_hidden, password, path_and_query_values};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let url = text.as_ref();
    let secrets: Vec<String> = password(url, url).into_iter().collect();
    let mut hidden = secrets.clone();
    hidden.extend(path_and_query_values(url, url));
    let check = |what: &str, result: Result<String, String>| match result {
        Ok(config) => assert_hidden(&secrets, &config, &format!("{what}'s configuration")),
        Err(error) => assert_hidden(&hidden, &error, &format!("{what}'s error")),
    };
    check(
        "redis",
        shown(outbox_sink_redis::RedisSinkConfig::from_url(url)),
    );
    check(
        "amqp",
        shown(outbox_sink_amqp::AmqpSinkConfig::from_url(url)),
    );
    check(
        "kafka",
        shown(outbox_sink_kafka::KafkaSinkConfig::from_url(url)),
    );
    check("sqs", shown(outbox_sink_sqs::SqsSinkConfig::from_url(url)));
    check(
        "nats",
        shown(outbox_sink_nats::NatsSinkConfig::from_url(url)),
    );
    check(
        "mqtt",
        shown(outbox_sink_mqtt::MqttSinkConfig::from_url(url)),
    );
    check(
        "http",
        Ok(format!(
            "{:?}",
            outbox_sink_http::HttpSinkConfig::from_url(url)
        )),
    );
    if let Err(error) = outbox_sink_http::HttpSinkConfig::from_url(url).build() {
        assert_hidden(&hidden, &error.to_string(), "the http sink's error");
    }
    if let Ok(parsed) = url::Url::parse(url)
        && let Err(error) = outbox_sink_http::ssrf::SsrfPolicy::default().check_url(&parsed)
    {
        assert_hidden(&hidden, &error.to_string(), "the SSRF policy's error");
    }
    assert_hidden(&hidden, &redact::url(url), "redact::url");
});

/// A sink's reading of a URL as text: its configuration's `Debug`, or its error.
fn shown<T: std::fmt::Debug, E: std::fmt::Display>(read: Result<T, E>) -> Result<String, String> {
    read.map(|config| format!("{config:?}"))
        .map_err(|error| error.to_string())
}
