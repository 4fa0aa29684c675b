//! The names of a configuration type's settings, read from its `Deserialize`, so a test
//! can check that a table of cases covers every one of them.

use serde::de::{self, Deserializer, Visitor};

/// The field names a `#[derive(Deserialize)]` struct takes (after `rename`), in
/// declaration order: what a config table of that type may set.
///
/// ```
/// #[derive(serde::Deserialize)]
/// struct Settings {
///     url: String,
///     #[serde(rename = "max_in_flight")]
///     _limit: usize,
/// }
/// assert_eq!(outbox_engine::testkit::setting_names::<Settings>(), ["url", "max_in_flight"]);
/// ```
///
/// # Panics
///
/// When `T` does not deserialize as a struct.
pub fn setting_names<'de, T: serde::Deserialize<'de>>() -> &'static [&'static str] {
    let mut names = Names(None);
    let _ = T::deserialize(&mut names);
    names
        .0
        .unwrap_or_else(|| panic!("{} is not a struct", std::any::type_name::<T>()))
}

/// A deserializer that only records the fields a struct asks for.
struct Names(Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for &mut Names {
    type Error = de::value::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(de::Error::custom("only the names were asked for"))
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// One setting written both ways: its path in a route's table (`fields.payload` for a
/// nested one), its value there, and the URL query that says the same.
pub type UrlCase = (&'static str, serde_json::Value, &'static str);

/// The cases of `tls_ca_file`, `tls_cert_file` and `tls_key_file`, which every sink with
/// TLS takes, for [`assert_url_parity`].
pub fn tls_file_cases() -> [UrlCase; 3] {
    use serde_json::json;
    [
        (
            "tls_ca_file",
            json!("/etc/ca.pem"),
            "tls_ca_file=/etc/ca.pem",
        ),
        (
            "tls_cert_file",
            json!("/etc/c.pem"),
            "tls_cert_file=/etc/c.pem",
        ),
        (
            "tls_key_file",
            json!("/etc/k.pem"),
            "tls_key_file=/etc/k.pem",
        ),
    ]
}

/// Checks that a sink's route table and its URL speak one vocabulary. For every case,
/// the URL `base?query` read by `from_url`, the table `{url = base, <path> = value}` and
/// the table `{url = "base?query"}` (read as the registry reads a route) give the same
/// configuration as `view` sees it (the resolved settings, for a sink that reads its
/// URL's query when it starts), which differs from `base`'s defaults, and the setting
/// given both ways is refused. Every table setting (nested ones through `nested`) has a
/// case, but those in `table_only`; so has every option in `url_options`.
///
/// # Panics
///
/// On the first case that differs, naming it.
pub fn assert_url_parity<S, V>(
    base: &str,
    from_url: fn(&str) -> Result<S::Config, S::Error>,
    view: fn(&S::Config) -> V,
    nested: &[(&str, &'static [&'static str])],
    table_only: &[&str],
    url_options: &[&str],
    cases: &[UrlCase],
) where
    S: crate::registry::RouteSink,
    V: PartialEq + std::fmt::Debug,
{
    let parse = |table: serde_json::Value| -> V {
        let settings = crate::registry::RouteSettings {
            route: "parity".to_owned(),
            settings: table,
        };
        let mut config: S::Config = settings
            .parse()
            .unwrap_or_else(|e| panic!("{settings:?}: {e}"));
        S::url_options(&mut config).unwrap_or_else(|e| panic!("{settings:?}: {e}"));
        view(&config)
    };
    let defaults = view(&from_url(base).unwrap_or_else(|e| panic!("{base}: {e}")));
    for (path, value, query) in cases {
        let url = format!("{base}?{query}");
        let via_url = view(&from_url(&url).unwrap_or_else(|e| panic!("{url}: {e}")));
        let mut table = serde_json::json!({ "url": base });
        let mut slot = &mut table;
        for segment in path.split('.') {
            slot = &mut slot[segment];
        }
        *slot = value.clone();
        let via_table = parse(table.clone());
        let via_route_url = parse(serde_json::json!({ "url": url }));
        assert_ne!(via_url, defaults, "`{query}` changes nothing");
        assert_eq!(
            via_url, via_table,
            "`{query}` against table setting `{path}`"
        );
        assert_eq!(via_url, via_route_url, "`{query}` in a route's url");

        table["url"] = url.into();
        let both = crate::registry::RouteSettings {
            route: "parity".to_owned(),
            settings: table,
        };
        let refused = (crate::registry::SinkDriver::of::<S>().check)(&both)
            .expect_err("a setting given both in the URL and the table");
        assert!(
            refused.to_string().contains("given both"),
            "`{query}` and table setting `{path}`: {refused}"
        );
    }
    let covered = |name: &str| cases.iter().any(|(path, _, _)| *path == name);
    for name in setting_names::<S::Config>() {
        if *name == "url" || table_only.contains(name) {
            continue;
        }
        match nested.iter().find(|(parent, _)| parent == name) {
            Some((parent, fields)) => {
                for field in *fields {
                    let path = format!("{parent}.{field}");
                    assert!(covered(&path), "table setting `{path}` has no URL case");
                }
            }
            None => assert!(covered(name), "table setting `{name}` has no URL case"),
        }
    }
    for option in url_options {
        assert!(
            cases.iter().any(|(_, _, query)| query
                .split('&')
                .any(|pair| pair.split('=').next() == Some(option))),
            "URL option `{option}` has no case"
        );
    }
}
