use outbox_engine::Message;

use super::url::{SINK_OPTIONS, parse_duration};
use super::*;

/// One vocabulary: every setting of a route's table is a URL option, and the reverse.
#[test]
fn every_table_setting_is_a_url_option_and_the_reverse() {
    use serde_json::json;
    outbox_engine::testkit::assert_url_parity::<crate::RedisSink, _>(
        "redis://127.0.0.1:6379/",
        RedisSinkConfig::from_url,
        RedisSinkConfig::clone,
        &[(
            "fields",
            outbox_engine::testkit::setting_names::<FieldLayout>(),
        )],
        &[],
        SINK_OPTIONS,
        &[
            &[
                (
                    "stream",
                    json!("orders.{event_type}"),
                    "stream=orders.{event_type}",
                ),
                ("maxlen", json!(1000), "maxlen=1000"),
                ("dedupe_window", json!("10m"), "dedupe_window=10m"),
                ("dedupe_window", json!("off"), "dedupe_window=off"),
                ("dedupe_window", json!(null), "dedupe_window=none"),
                (
                    "dedupe_prefix",
                    json!("app:seen:"),
                    "dedupe_prefix=app:seen:",
                ),
                (
                    "durability",
                    json!({ "mode": "wait", "replicas": 1, "timeout": "250ms" }),
                    "durability=wait:1&durability_timeout=250ms",
                ),
                (
                    "durability",
                    json!({ "mode": "wait_aof", "local": true, "replicas": 0 }),
                    "durability=waitaof:1:0",
                ),
                ("fields.id", json!("msg_id"), "fields.id=msg_id"),
                (
                    "fields.idempotency_key",
                    json!("key"),
                    "fields.idempotency_key=key",
                ),
                ("fields.event_type", json!("type"), "fields.event_type=type"),
                ("fields.content_type", json!("ct"), "fields.content_type=ct"),
                ("fields.payload", json!("data"), "fields.payload=data"),
                ("fields.metadata", json!(false), "metadata=false"),
                (
                    "fields.headers",
                    json!({ "layout": "json", "field": "hdrs" }),
                    "headers=json:hdrs",
                ),
                ("max_payload_bytes", json!(1024), "max_payload_bytes=1024"),
                ("connect_timeout", json!("2s"), "connect_timeout=2s"),
                ("response_timeout", json!("3s"), "response_timeout=3s"),
            ][..],
            &outbox_engine::testkit::tls_file_cases(),
        ]
        .concat(),
    );
}
use chrono::Utc;
use outbox_engine::NewMessage;

fn message() -> Message {
    NewMessage::builder("orders", "order.paid")
        .tenant_id("acme")
        .build()
        .unwrap()
        .into_message(Utc::now())
}

#[test]
fn templates_render_fields_and_escapes() {
    let t = StreamTemplate::parse("{{x}}:{destination}/{event_type}@{tenant_id}").unwrap();
    assert_eq!(t.render(&message()).unwrap(), "{x}:orders/order.paid@acme");
    assert_eq!(t.fixed(), None);
    let fixed = StreamTemplate::parse("a{{b}}c").unwrap();
    assert_eq!(fixed.fixed().as_deref(), Some("a{b}c"));
    assert_eq!(fixed.render(&message()).unwrap(), "a{b}c");
    // Multi-byte characters next to placeholders.
    let t = StreamTemplate::parse("é{event_type}ü").unwrap();
    assert_eq!(t.render(&message()).unwrap(), "éorder.paidü");
}

#[test]
fn bad_templates_are_typed_errors() {
    for (template, needle) in [
        ("", "empty"),
        ("a{", "unclosed"),
        ("a{event_type", "unclosed"),
        ("a}", "unmatched"),
        ("{}", "unknown placeholder"),
        ("{Event_Type}", "unknown placeholder"),
        ("{partition key}", "unknown placeholder"),
        ("a\nb", "control"),
    ] {
        match StreamTemplate::parse(template) {
            Err(RedisSinkError::InvalidTemplate { reason, .. }) => {
                assert!(reason.contains(needle), "{template:?}: {reason}")
            }
            other => panic!("{template:?}: {other:?}"),
        }
    }
    let long = "x".repeat(MAX_STREAM_KEY_BYTES + 1);
    assert!(StreamTemplate::parse(&long).is_err());
}

#[test]
fn rendering_fails_cleanly_for_missing_fields_and_long_keys() {
    let t = StreamTemplate::parse("s.{partition_key}").unwrap();
    let err = t.render(&message()).unwrap_err();
    assert!(err.contains("partition_key"), "{err}");
    let long_type = NewMessage::builder("orders", "e".repeat(255))
        .build()
        .unwrap()
        .into_message(Utc::now());
    let t = StreamTemplate::parse(&format!(
        "{}{{event_type}}",
        "k".repeat(MAX_STREAM_KEY_BYTES - 20)
    ))
    .unwrap();
    assert!(t.render(&message()).is_ok());
    assert!(t.render(&long_type).unwrap_err().contains("limit"));
}

#[test]
fn from_url_reads_options_and_keeps_client_ones() {
    let c = RedisSinkConfig::from_url(
        "redis://u:p%40ss@h:6380/2?protocol=resp3&stream=s.{event_type}&maxlen=10&dedupe_window=90s&dedupe_prefix=d:&durability=waitaof:1:0&durability_timeout=2s&headers=fields:hdr.&metadata=false&max_payload_bytes=100&connect_timeout=1s&response_timeout=3s",
    )
    .unwrap();
    assert_eq!(c.url, "redis://u:p%40ss@h:6380/2?protocol=resp3");
    assert_eq!(c.stream, "s.{event_type}");
    assert_eq!(c.maxlen, Some(10));
    assert_eq!(c.dedupe_window, Some(Duration::from_secs(90)));
    assert_eq!(c.dedupe_prefix, "d:");
    assert_eq!(
        c.durability,
        Durability::wait_aof(true, 0, Duration::from_secs(2))
    );
    assert_eq!(
        c.fields.headers,
        HeaderLayout::Prefixed {
            prefix: "hdr.".into()
        }
    );
    assert!(!c.fields.metadata);
    assert_eq!(c.max_payload_bytes, 100);
    assert_eq!(c.connect_timeout, Duration::from_secs(1));
    assert_eq!(c.response_timeout, Duration::from_secs(3));
    c.validate().unwrap();
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("p%40ss") && debug.contains("***"),
        "{debug}"
    );
}

#[test]
fn bad_urls_and_options_are_typed_errors() {
    for url in [
        "not a url",
        "http://127.0.0.1/",
        "redis:///",
        "redis://h/notadb",
        "redis://h/?foo=1",
    ] {
        assert!(
            matches!(
                RedisSinkConfig::from_url(url),
                Err(RedisSinkError::InvalidUrl { .. })
            ),
            "{url}"
        );
    }
    for (url, setting) in [
        ("redis://h/?maxlen=-1", "maxlen"),
        ("redis://h/?dedupe_window=5 parsecs", "dedupe_window"),
        ("redis://h/?durability=wait", "durability"),
        ("redis://h/?durability=waitaof:2:0", "durability"),
        ("redis://h/?durability_timeout=1s", "durability_timeout"),
        ("redis://h/?headers=xml", "headers"),
        ("redis://h/?metadata=maybe", "metadata"),
    ] {
        match RedisSinkConfig::from_url(url) {
            Err(RedisSinkError::InvalidSetting { setting: s, .. }) => {
                assert_eq!(s, setting, "{url}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
    // Sink options given to `new` instead of `from_url` are caught by validate.
    assert!(matches!(
        RedisSinkConfig::new("redis://h/?stream=x").validate(),
        Err(RedisSinkError::InvalidUrl { .. })
    ));
}

#[test]
fn validate_checks_each_setting() {
    let ok = RedisSinkConfig::default();
    ok.validate().unwrap();
    let cases: Vec<(RedisSinkConfig, &str)> = vec![
        (ok.clone().maxlen(Some(0)), "maxlen"),
        (
            ok.clone().dedupe_window(Some(Duration::ZERO)),
            "dedupe_window",
        ),
        (ok.clone().dedupe_prefix(""), "dedupe_prefix"),
        (ok.clone().max_payload_bytes(0), "max_payload_bytes"),
        (
            ok.clone().connect_timeout(Duration::ZERO),
            "connect_timeout",
        ),
        (
            ok.clone()
                .durability(Durability::wait(0, Duration::from_secs(5))),
            "durability.timeout",
        ),
        (
            ok.clone().durability(Durability::wait(0, Duration::ZERO)),
            "durability.timeout",
        ),
    ];
    for (config, setting) in cases {
        match config.validate() {
            Err(RedisSinkError::InvalidSetting { setting: s, .. }) => assert_eq!(s, setting),
            other => panic!("{setting}: {other:?}"),
        }
    }
    let tls_on_plain = ok.clone().tls_ca_file("/ca.pem");
    assert!(matches!(
        tls_on_plain.validate(),
        Err(RedisSinkError::InvalidSetting {
            setting: "tls_ca_file",
            ..
        })
    ));
    let mut half = RedisSinkConfig::new("rediss://h/");
    half.tls_cert_file = Some("/client.pem".into());
    match half.validate() {
        Err(RedisSinkError::InvalidSetting { setting, .. }) => {
            assert_eq!(setting, "tls_cert_file")
        }
        // Without a TLS feature the URL itself is refused first.
        Err(RedisSinkError::TlsNotEnabled) => {}
        other => panic!("{other:?}"),
    }
    // No deduplication: the prefix does not matter.
    ok.clone()
        .dedupe_window(None)
        .dedupe_prefix("")
        .validate()
        .unwrap();
}

#[test]
fn field_layout_rejects_clashes() {
    let l = FieldLayout {
        headers: HeaderLayout::Prefixed { prefix: "i".into() },
        ..FieldLayout::default()
    };
    assert!(l.validate().is_err(), "`id` starts with the prefix");
    let mut l = FieldLayout {
        payload: "tenant_id".into(),
        ..FieldLayout::default()
    };
    assert!(l.validate().is_err(), "clashes with metadata");
    l.metadata = false;
    l.validate().unwrap();
    let mut l = FieldLayout {
        headers: HeaderLayout::Json {
            field: "payload".into(),
        },
        ..FieldLayout::default()
    };
    assert!(l.validate().is_err());
    l.headers = HeaderLayout::default();
    l.validate().unwrap();
    l.id = String::new();
    assert!(l.validate().is_err());
}

#[test]
fn deserializes_from_json_with_defaults_and_durations() {
    let c: RedisSinkConfig = serde_json::from_value(serde_json::json!({
        "url": "redis://127.0.0.1:6379/1",
        "stream": "events",
        "dedupe_window": "2m",
        "durability": { "mode": "wait", "replicas": 1, "timeout": "250ms" },
        "fields": { "payload": "body", "headers": { "layout": "json", "field": "hdrs" } },
        "response_timeout": "10s"
    }))
    .unwrap();
    assert_eq!(c.dedupe_window, Some(Duration::from_secs(120)));
    assert_eq!(
        c.durability,
        Durability::wait(1, Duration::from_millis(250))
    );
    assert_eq!(c.fields.payload, "body");
    assert_eq!(c.fields.id, "id");
    assert_eq!(c.response_timeout, Duration::from_secs(10));
    assert_eq!(c.connect_timeout, Duration::from_secs(5));
    c.validate().unwrap();
    let off: RedisSinkConfig =
        serde_json::from_value(serde_json::json!({ "dedupe_window": null })).unwrap();
    assert_eq!(off.dedupe_window, None);
    assert!(
        serde_json::from_value::<RedisSinkConfig>(serde_json::json!({ "strem": "x" })).is_err()
    );
    assert!(
        serde_json::from_value::<RedisSinkConfig>(
            serde_json::json!({ "connect_timeout": "5 fortnights" })
        )
        .is_err()
    );
}

#[test]
fn durations_parse() {
    assert!(parse_duration("250").unwrap_err().contains("needs a unit"));
    assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
    assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
    assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
    assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    assert!(parse_duration("").is_err());
    assert!(parse_duration("s").is_err());
    assert!(parse_duration("1x").is_err());
    assert!(parse_duration("99999999999999999999d").is_err());
}
