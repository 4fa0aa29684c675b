use super::*;

#[test]
fn dedupe_keys_cannot_collide() {
    assert_ne!(dedupe_key("p:", "a:b", "c"), dedupe_key("p:", "a", "b:c"),);
    assert_eq!(dedupe_key("p:", "s", "k"), "p:1:s:k");
}

#[test]
fn reads_info_and_versions() {
    let info = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n";
    assert_eq!(info_field(info, "redis_version"), Some("7.0.15"));
    assert_eq!(info_field(info, "redis"), None);
    assert_eq!(parse_version("7.0.15"), Some((7, 0)));
    assert_eq!(parse_version("7.2.4"), Some((7, 2)));
    assert_eq!(parse_version("garbage"), None);
    assert!(parse_version("6.2.14").unwrap() >= MIN_VERSION);
    assert!(parse_version("5.0.7").unwrap() < MIN_VERSION);
}

#[test]
fn entry_replies() {
    assert_eq!(
        entry_reply(Value::BulkString(b"1-0".to_vec())).unwrap(),
        ("1-0".to_owned(), true)
    );
    assert_eq!(
        entry_reply(Value::Array(vec![
            Value::BulkString(b"2-0".to_vec()),
            Value::Int(0)
        ]))
        .unwrap(),
        ("2-0".to_owned(), false)
    );
    let f = entry_reply(Value::Nil).unwrap_err();
    assert!(f.retryable, "an unexpected reply is never published: {f}");
    let f = entry_reply(Value::Array(vec![Value::Int(1)])).unwrap_err();
    assert!(f.retryable);
}

/// Any reply shape a server (or something posing as one) can send.
fn replies() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        any::<i64>().prop_map(Value::Int),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Value::BulkString),
        ".{0,24}".prop_map(Value::SimpleString),
        any::<f64>().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
            proptest::collection::vec((inner.clone(), inner), 0..3).prop_map(Value::Map),
        ]
    })
}

proptest::proptest! {
    /// No reply panics the sink; an entry is taken as written only from the shapes
    /// XADD and the dedupe script answer with, and any other reply is a retryable
    /// failure (the batch is sent again, never marked).
    #[test]
    fn any_reply_is_read_or_refused(reply in replies()) {
        let expected = match &reply {
            Value::BulkString(id) => std::str::from_utf8(id).ok().map(|id| (id.to_owned(), true)),
            Value::SimpleString(id) => Some((id.clone(), true)),
            Value::Array(items) => match items.as_slice() {
                [Value::BulkString(id), Value::Int(new)] => {
                    std::str::from_utf8(id).ok().map(|id| (id.to_owned(), *new == 1))
                }
                [Value::SimpleString(id), Value::Int(new)] => Some((id.clone(), *new == 1)),
                _ => None,
            },
            _ => None,
        };
        match entry_reply(reply) {
            Ok(read) => proptest::prop_assert_eq!(Some(read), expected),
            Err(failure) => {
                proptest::prop_assert!(expected.is_none());
                proptest::prop_assert!(failure.retryable);
            }
        }
    }
}
