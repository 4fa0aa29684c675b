//! `docs/CONFIG.md`, the reference of every configuration key, is generated from the
//! settings' own structs: each key's name (serde's), type, default (from the struct's
//! `Default`, a `#[serde(default = …)]` function, or "required") and doc comment, and its
//! environment variable. This test fails when the committed file is not what the code
//! gives; `OUTBOX_WRITE_REFERENCE=1 cargo test -p outbox --test config_reference`
//! writes it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use quote::ToTokens;

/// One table of the configuration: its heading, the env prefix of its keys (or, ending in
/// `=`, the variable of an inline table), and the struct (file and name) that reads it.
struct Table {
    heading: &'static str,
    about: &'static str,
    env: &'static str,
    file: &'static str,
    name: &'static str,
}

const TABLES: &[Table] = &[
    Table {
        heading: "[store]",
        about: "Where the outbox table lives.",
        env: "OUTBOX_STORE__",
        file: "outbox-core/src/registry.rs",
        name: "StoreSettings",
    },
    Table {
        heading: "[relay]",
        about: "How the relay claims and publishes.",
        env: "OUTBOX_RELAY__",
        file: "outbox-core/src/settings.rs",
        name: "RelaySettings",
    },
    Table {
        heading: "[retry]",
        about: "Backoff (full jitter) and giving up.",
        env: "OUTBOX_RETRY__",
        file: "outbox-core/src/settings.rs",
        name: "RetrySettings",
    },
    Table {
        heading: "[metrics]",
        about: "The operator's endpoints of `outbox relay`.",
        env: "OUTBOX_METRICS__",
        file: "outbox/src/config.rs",
        name: "MetricsConfig",
    },
    Table {
        heading: "[health]",
        about: "Liveness, readiness and the lag objective (`/healthz`, `/readyz`, `/slo`).",
        env: "OUTBOX_HEALTH__",
        file: "outbox/src/config.rs",
        name: "HealthConfig",
    },
    Table {
        heading: "[dashboard]",
        about: "The web dashboard; off without this table.",
        env: "OUTBOX_DASHBOARD__",
        file: "outbox/src/config.rs",
        name: "DashboardConfig",
    },
    Table {
        heading: "[routes.NAME]: policies",
        about: "One route per destination `NAME`; its `url` scheme picks the sink. These keys apply to every sink.",
        env: "OUTBOX_ROUTES__NAME__",
        file: "outbox-core/src/layers/mod.rs",
        name: "RoutePolicy",
    },
    Table {
        heading: "rate_limit = { … }",
        about: "A route's rate limit (an inline table).",
        env: "OUTBOX_ROUTES__NAME__RATE_LIMIT=",
        file: "outbox-core/src/layers/rate.rs",
        name: "RateLimit",
    },
    Table {
        heading: "circuit = { … }",
        about: "A route's circuit breaker (an inline table).",
        env: "OUTBOX_ROUTES__NAME__CIRCUIT=",
        file: "outbox-core/src/layers/circuit.rs",
        name: "CircuitConfig",
    },
    Table {
        heading: "[routes.NAME]: `http://`, `https://`",
        about: "Webhooks (feature `http`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-http/src/config.rs",
        name: "HttpSinkConfig",
    },
    Table {
        heading: "[routes.NAME]: `redis://`, `rediss://`",
        about: "Redis Streams (feature `redis`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-redis/src/config.rs",
        name: "RedisSinkConfig",
    },
    Table {
        heading: "fields = { … }",
        about: "A Redis route's entry field names (an inline table).",
        env: "OUTBOX_ROUTES__NAME__FIELDS=",
        file: "sink-redis/src/config.rs",
        name: "FieldLayout",
    },
    Table {
        heading: "[routes.NAME]: `amqp://`, `amqps://`",
        about: "RabbitMQ (feature `amqp`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-amqp/src/config.rs",
        name: "AmqpSinkConfig",
    },
    Table {
        heading: "[routes.NAME]: `kafka://`",
        about: "Kafka (feature `kafka`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-kafka/src/config.rs",
        name: "KafkaSinkConfig",
    },
    Table {
        heading: "[routes.NAME]: `sqs://`, `sqs+https://`",
        about: "Amazon SQS (feature `sqs`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-sqs/src/config.rs",
        name: "SqsSinkConfig",
    },
    Table {
        heading: "[routes.NAME]: `nats://`, `nats+tls://`",
        about: "NATS JetStream (feature `nats`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-nats/src/config.rs",
        name: "NatsSinkConfig",
    },
    Table {
        heading: "[routes.NAME]: `mqtt://`, `mqtts://`",
        about: "MQTT (feature `mqtt`).",
        env: "OUTBOX_ROUTES__NAME__",
        file: "sink-mqtt/src/config.rs",
        name: "MqttSinkConfig",
    },
];

#[test]
fn the_config_reference_is_what_the_code_reads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let generated = render(&root);
    let path = root.join("docs/CONFIG.md");
    if std::env::var_os("OUTBOX_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/CONFIG.md is not what the code reads; regenerate it with \
         `OUTBOX_WRITE_REFERENCE=1 cargo test -p outbox --test config_reference`"
    );
}

/// Every key of every table has a doc comment, and each table at least one key: a
/// setting nobody can look up is a setting nobody can use.
#[test]
fn every_key_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for table in TABLES {
        let keys = keys(&root, table);
        assert!(!keys.is_empty(), "{}: no keys found", table.name);
        for key in keys {
            assert!(
                !key.about.is_empty(),
                "{}.{} has no doc comment",
                table.name,
                key.name
            );
        }
    }
}

fn render(root: &Path) -> String {
    let mut out = String::from(
        "<!-- Generated from the settings' structs by outbox/tests/config_reference.rs; \
         do not edit. -->\n\n# Configuration reference\n\n\
         Every key `outbox relay` and `Outbox::from_config` read, table by table. A TOML file \
         gives them (`outbox --config FILE`), and `OUTBOX_…` environment variables override \
         or replace it: the path in upper case with `__` between its parts. Lists and inline \
         tables are written as in TOML (`OUTBOX_ROUTES__BILLING__ALLOW=[10.0.0.0/8]`). \
         Durations take a unit (`250ms`, `30s`, `5m`, `1d`). A key or variable that matches no \
         setting is an error, and `outbox config check` checks a configuration without \
         running it. A blank default means unset: the description says what applies then.\n",
    );
    for table in TABLES {
        let _ = write!(
            out,
            "\n## {}\n\n{}\n\n| key | type | default | environment | description |\n|---|---|---|---|---|\n",
            table.heading, table.about
        );
        for key in keys(root, table) {
            // An inline table's keys are set inside its variable's value.
            let env = match table.env.strip_suffix('=') {
                Some(variable) => format!("{variable}={{{}=…}}", key.name),
                None => format!("{}{}", table.env, key.name.to_ascii_uppercase()),
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | `{env}` | {} |",
                key.name,
                key.kind,
                key.default,
                key.about.replace('|', "\\|")
            );
        }
    }
    out
}

struct Key {
    name: String,
    kind: String,
    default: String,
    about: String,
}

fn keys(root: &Path, table: &Table) -> Vec<Key> {
    let file = parse(&root.join(table.file));
    let strukt = file
        .items
        .iter()
        .find_map(|item| match item {
            syn::Item::Struct(s) if s.ident == table.name => Some(s),
            _ => None,
        })
        .unwrap_or_else(|| panic!("struct {} in {}", table.name, table.file));
    let struct_default = serde_words(&strukt.attrs).iter().any(|w| w == "default");
    let defaults = default_impl(&file, table.name);
    let syn::Fields::Named(fields) = &strukt.fields else {
        panic!("{} has named fields", table.name);
    };
    fields
        .named
        .iter()
        .filter(|f| matches!(f.vis, syn::Visibility::Public(_)))
        .filter(|f| !serde_words(&f.attrs).iter().any(|w| w == "skip"))
        .map(|f| {
            let name = f.ident.as_ref().unwrap().to_string();
            let words = serde_words(&f.attrs);
            let default_fn = serde_value(&f.attrs, "default");
            let optional = type_text(&f.ty).starts_with("Option <");
            let default = if let Some(function) = default_fn {
                function_value(&file, &function)
                    .map_or_else(|| "computed".to_owned(), |v| pretty(&v))
            } else if struct_default || words.iter().any(|w| w == "default") {
                match defaults.iter().find(|(field, _)| *field == name) {
                    Some((_, value)) => pretty(value),
                    None => zero(&f.ty),
                }
            } else if optional {
                String::new()
            } else {
                "required".to_owned()
            };
            Key {
                kind: kind(&f.ty),
                default,
                about: doc(&f.attrs),
                name,
            }
        })
        .collect()
}

fn parse(path: &PathBuf) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The words inside `#[serde(...)]`: `default`, `skip`, `default = "f"` as `default`.
fn serde_words(attrs: &[syn::Attribute]) -> Vec<String> {
    let mut words = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            words.push(meta.path.to_token_stream().to_string());
            if meta.input.peek(syn::Token![=]) {
                let _: syn::Expr = meta.value()?.parse()?;
            }
            Ok(())
        });
    }
    words
}

/// The string value of `#[serde(key = "value")]`.
fn serde_value(attrs: &[syn::Attribute], key: &str) -> Option<String> {
    let mut found = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.input.peek(syn::Token![=]) {
                let value: syn::LitStr = meta.value()?.parse()?;
                if meta.path.is_ident(key) {
                    found = Some(value.value());
                }
            }
            Ok(())
        });
    }
    found
}

fn doc(attrs: &[syn::Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value().trim().to_owned()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    // Intra-doc links read as code: [`X`](path) → `X`.
    let text = lines.join(" ");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(open) = rest.find("[`") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find("`]") else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        out.push_str(&after[..=close]);
        rest = &after[close + 2..];
        if rest.starts_with('(')
            && let Some(end) = rest.find(')')
        {
            rest = &rest[end + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// `(field, value)` of `impl Default for NAME { fn default() -> Self { Self { … } } }`.
fn default_impl(file: &syn::File, name: &str) -> Vec<(String, syn::Expr)> {
    for item in &file.items {
        let syn::Item::Impl(imp) = item else { continue };
        let is_default = imp
            .trait_
            .as_ref()
            .is_some_and(|(_, path, _)| path.segments.last().is_some_and(|s| s.ident == "Default"));
        if !is_default || type_text(&imp.self_ty) != name {
            continue;
        }
        for inner in &imp.items {
            let syn::ImplItem::Fn(f) = inner else {
                continue;
            };
            if let Some(syn::Stmt::Expr(syn::Expr::Struct(s), None)) = f.block.stmts.last() {
                return s
                    .fields
                    .iter()
                    .filter_map(|fv| match &fv.member {
                        syn::Member::Named(ident) => Some((ident.to_string(), fv.expr.clone())),
                        syn::Member::Unnamed(_) => None,
                    })
                    .collect();
            }
        }
    }
    Vec::new()
}

/// The value a `#[serde(default = "function")]` function returns, when it is one
/// expression (a free function, or `Type::function`).
fn function_value(file: &syn::File, path: &str) -> Option<syn::Expr> {
    let name = path.rsplit("::").next()?;
    let body = |block: &syn::Block| match block.stmts.last() {
        Some(syn::Stmt::Expr(expr, None)) if block.stmts.len() == 1 => Some(expr.clone()),
        _ => None,
    };
    for item in &file.items {
        match item {
            syn::Item::Fn(f) if f.sig.ident == name => return body(&f.block),
            syn::Item::Impl(imp) => {
                for inner in &imp.items {
                    if let syn::ImplItem::Fn(f) = inner
                        && f.sig.ident == name
                    {
                        return body(&f.block);
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// What a derived `Default` gives a field of type `ty`.
fn zero(ty: &syn::Type) -> String {
    let text = type_text(ty);
    match text.as_str() {
        "bool" => "`false`".to_owned(),
        "String" => String::new(),
        t if t.starts_with("Option <") || t.starts_with("Vec <") || t.starts_with("BTreeMap <") => {
            String::new()
        }
        "u16" | "u32" | "u64" | "usize" | "f64" => "`0`".to_owned(),
        _ => "its default".to_owned(),
    }
}

fn type_text(ty: &syn::Type) -> String {
    ty.to_token_stream().to_string()
}

/// A reader's name for a field type.
fn kind(ty: &syn::Type) -> String {
    let text = type_text(ty);
    let inner = text
        .strip_prefix("Option < ")
        .and_then(|t| t.strip_suffix(" >"))
        .unwrap_or(&text);
    match inner {
        "String" => "string".to_owned(),
        "bool" => "boolean".to_owned(),
        "u16" | "u32" | "u64" | "usize" => "integer".to_owned(),
        "f64" => "number".to_owned(),
        "Duration" => "duration".to_owned(),
        "PathBuf" | "std :: path :: PathBuf" => "path".to_owned(),
        "Vec < String >" => "list of strings".to_owned(),
        t if t.starts_with("Vec <") => format!("list of {}", t[6..t.len() - 2].trim()),
        t if t.starts_with("BTreeMap < String ,") => {
            format!("table of {}", t[19..t.len() - 2].trim())
        }
        other => format!("{other} (see its description)"),
    }
}

/// A default value as a reader writes it: `30s`, `"POST"`, `8`.
fn pretty(expr: &syn::Expr) -> String {
    let text = expr.to_token_stream().to_string();
    let call = |name: &str| {
        text.strip_prefix(name)
            .and_then(|t| t.strip_prefix(" ("))
            .and_then(|t| t.strip_suffix(')'))
            .map(str::trim)
    };
    if let Some(n) = call("Duration :: from_secs") {
        return format!("`{}s`", n.replace(' ', ""));
    }
    if let Some(n) = call("Duration :: from_millis") {
        return format!("`{}ms`", n.replace(' ', ""));
    }
    if let Some(inner) = call("Some") {
        return pretty(&syn::parse_str(inner).unwrap());
    }
    if text == "None" || text == "Vec :: new ()" || text == "String :: new ()" {
        return String::new();
    }
    if text.contains(" ! (") {
        return "computed".to_owned();
    }
    for suffix in [" . to_owned ()", " . to_string ()", " . into ()"] {
        if let Some(literal) = text.strip_suffix(suffix) {
            return format!("`{literal}`");
        }
    }
    format!(
        "`{}`",
        text.replace(" :: ", "::")
            .replace(" (", "(")
            .replace("( ", "(")
            .replace(" )", ")")
    )
}
