//! A route URL as each sink reads it, and as logs print it. Nothing may panic; no error,
//! configuration or redacted form may repeat the URL's password.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_engine::redact;
use outbox_fuzz::{assert_hidden, password};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let url = text.as_ref();
    let secrets: Vec<String> = password(url, url).into_iter().collect();
    let check = |what: &str, result: Result<String, String>| match result {
        Ok(config) => assert_hidden(&secrets, &config, &format!("{what}'s configuration")),
        Err(error) => assert_hidden(&secrets, &error, &format!("{what}'s error")),
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
        "http",
        Ok(format!(
            "{:?}",
            outbox_sink_http::HttpSinkConfig::from_url(url)
        )),
    );
    if let Ok(parsed) = url::Url::parse(url)
        && let Err(error) = outbox_sink_http::ssrf::SsrfPolicy::default().check_url(&parsed)
    {
        assert_hidden(&secrets, &error.to_string(), "the SSRF policy's error");
    }
    assert_hidden(&secrets, &redact::url(url), "redact::url");
    assert_hidden(&secrets, &redact::endpoint(url), "redact::endpoint");
    assert_hidden(&secrets, &outbox_sink_redis::redact_url(url), "redact_url");
});

/// A sink's reading of a URL as text: its configuration's `Debug`, or its error.
fn shown<T: std::fmt::Debug, E: std::fmt::Display>(read: Result<T, E>) -> Result<String, String> {
    read.map(|config| format!("{config:?}"))
        .map_err(|error| error.to_string())
}
