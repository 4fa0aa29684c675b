//! The `outbox` binary against a real PostgreSQL.

use std::process::{Command, Output};
use std::time::Duration;

use outbox::NewMessage;
use outbox::TableNames;
use outbox::postgres::PgOutbox;

mod common;

use common::Fate;

const URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

fn outbox_cmd(args: &[&str]) -> Output {
    outbox_test_support::output_within(
        &format!("outbox {}", args.join(" ")),
        Duration::from_secs(60),
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(args)
            .env_remove("OUTBOX_CONFIG")
            .env_remove("RUST_LOG")
            .env_remove("OUTBOX_LOG_FORMAT"),
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn outbox_table() -> (PgOutbox, String) {
    let table = format!("cli_{:016x}", fastrand::u64(..));
    let pool = match sqlx::PgPool::connect(&url()).await {
        Ok(pool) => pool,
        Err(e) => panic!(
            "PostgreSQL is not reachable at {} ({e}); run scripts/services.sh or set {URL_VAR}",
            url()
        ),
    };
    let outbox = PgOutbox::with_names(pool, TableNames::default().outbox(&table).unwrap());
    (outbox, table)
}

/// Enqueues messages and dead-letters some of them with reasons.
async fn seed(outbox: &PgOutbox, specs: &[(&str, &str, Option<&str>)]) -> Vec<outbox::MessageId> {
    let messages: Vec<NewMessage> = specs
        .iter()
        .map(|(d, e, _)| NewMessage::builder(*d, *e).json(&1).build().unwrap())
        .collect();
    let fates: Vec<Fate<'_>> = specs
        .iter()
        .map(|(_, _, why)| why.map_or(Fate::Pending, Fate::Dead))
        .collect();
    common::settle(outbox, &messages, &fates).await;
    messages.iter().map(NewMessage::id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_figures_match_the_database() {
    let (outbox, table) = outbox_table().await;
    let migrated = outbox_cmd(&["--store", &url(), "--table", &table, "migrate"]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));
    seed(
        &outbox,
        &[
            ("sms", "a", None),
            ("sms", "a", None),
            ("sms", "b", Some("400")),
            ("email", "c", Some("550")),
        ],
    )
    .await;
    let out = outbox_cmd(&["--store", &url(), "--table", &table, "status", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let row = |d: &str| {
        json["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["destination"] == d)
            .unwrap()
            .clone()
    };
    let counts: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
        "SELECT destination, count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'dead') FROM {table} GROUP BY destination"
    ))
    .fetch_all(outbox.pool())
    .await
    .unwrap();
    assert_eq!(counts.len(), 2);
    for (destination, pending, dead) in counts {
        let r = row(&destination);
        assert_eq!(
            (r["pending"].as_i64().unwrap(), r["dead"].as_i64().unwrap()),
            (pending, dead),
            "{destination}"
        );
    }
    assert!(row("sms")["oldest_pending_age_seconds"].as_f64().is_some());
    let declared = &json["capabilities"];
    assert_eq!(
        (
            &declared["store"],
            &declared["wakeups"],
            &declared["per_key_ordering"]
        ),
        (&"postgres".into(), &"database".into(), &true.into()),
        "{json}"
    );
    let table_out = outbox_cmd(&["--store", &url(), "--table", &table, "status"]);
    assert!(
        stdout(&table_out).starts_with("store postgres: published rows keep, per-key ordering yes"),
        "{}",
        stdout(&table_out)
    );
    assert!(
        stdout(&table_out)
            .lines()
            .any(|l| l.starts_with("sms") && l.split_whitespace().nth(1) == Some("2"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_replay_by_filter_moves_exactly_the_matching_rows() {
    let (outbox, table) = outbox_table().await;
    outbox.migrate().await.unwrap();
    let ids = seed(
        &outbox,
        &[
            ("sms", "order.paid", Some("400 bad phone")),
            ("sms", "order.shipped", Some("400 unknown template")),
            ("sms", "order.paid", Some("503 gave up")),
            ("email", "order.paid", Some("400 bad address")),
        ],
    )
    .await;
    let base = ["--store", &url(), "--table", &table, "dead"];
    let run = |extra: &[&str]| outbox_cmd(&[&base[..], extra].concat());

    let listed = run(&["list", "--destination", "sms", "--json"]);
    assert_eq!(stdout(&listed).lines().count(), 3, "{}", stderr(&listed));
    let dry = run(&[
        "replay",
        "--destination",
        "sms",
        "--error-contains",
        "400",
        "--dry-run",
    ]);
    assert_eq!(stdout(&dry).trim(), "would replay 2 dead letter(s)");
    let dead_before: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE status = 'dead'"
    ))
    .fetch_one(outbox.pool())
    .await
    .unwrap();
    assert_eq!(dead_before, 4, "a dry run changes nothing");

    let replayed = run(&["replay", "--destination", "sms", "--error-contains", "400"]);
    assert_eq!(
        stdout(&replayed).trim(),
        "replayed 2 dead letter(s)",
        "{}",
        stderr(&replayed)
    );
    let pending: Vec<uuid::Uuid> = sqlx::query_scalar(&format!(
        "SELECT id FROM {table} WHERE status = 'pending' ORDER BY id"
    ))
    .fetch_all(outbox.pool())
    .await
    .unwrap();
    assert_eq!(
        pending,
        vec![*ids[0].as_uuid(), *ids[1].as_uuid()],
        "exactly the matching rows"
    );

    let by_id = run(&["discard", "--id", &ids[3].to_string()]);
    assert_eq!(stdout(&by_id).trim(), "discarded 1 dead letter(s)");
    let dead_left = || async {
        sqlx::query_scalar::<_, i64>(&format!(
            "SELECT count(*) FROM {table} WHERE status = 'dead'"
        ))
        .fetch_one(outbox.pool())
        .await
        .unwrap()
    };
    assert_eq!(dead_left().await, 1);

    // Every dead letter only with --all; counting them needs no flag.
    for verb in ["replay", "discard"] {
        let refused = run(&[verb]);
        assert!(!refused.status.success(), "{verb} with no filter refused");
        assert!(stderr(&refused).contains("--all"), "{}", stderr(&refused));
        assert_eq!(dead_left().await, 1, "a refused {verb} changes nothing");
    }
    let count_all = run(&["discard", "--dry-run"]);
    assert_eq!(stdout(&count_all).trim(), "would discard 1 dead letter(s)");
    let all = run(&["discard", "--all"]);
    assert_eq!(
        stdout(&all).trim(),
        "discarded 1 dead letter(s)",
        "{}",
        stderr(&all)
    );
    assert_eq!(dead_left().await, 0);
}

#[test]
fn bad_configuration_gives_one_line_errors_and_a_failure_code() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // `--config <a file named name holding text> <command>`.
    let config = |name: &str, text: &str, command: &str| -> Vec<String> {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        vec![
            "--config".into(),
            path.display().to_string(),
            command.into(),
        ]
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--store".into(),
                "ftp://example.com".into(),
                "status".into(),
            ],
            "unsupported store URL",
        ),
        (
            vec![
                "--store".into(),
                "postgres://u:hunter2@127.0.0.1:1/x".into(),
                "status".into(),
            ],
            "Connection refused",
        ),
        (
            vec![
                "--store".into(),
                url(),
                "--table".into(),
                "never_migrated_table".into(),
                "status".into(),
            ],
            "`outbox migrate`",
        ),
        (
            config(
                "loopback.toml",
                "[store]\nurl = \"sqlite::memory:\"\n[routes.hooks]\nurl = \"http://127.0.0.1:9/hook\"\n",
                "relay",
            ),
            r#"route "hooks": invalid url: SSRF guard refused 127.0.0.1 (loopback); if this endpoint is meant to be internal, allow it for this route: `allow = ["127.0.0.1"]`"#,
        ),
        (
            config(
                "route-name.toml",
                "[store]\nurl = \"sqlite::memory:\"\n[routes.\"bad name!\"]\nurl = \"https://hooks.example.com/x\"\n",
                "relay",
            ),
            r#"routes."bad name!": invalid route name: character ' ' not allowed (use A-Z a-z 0-9 _ - . : /)"#,
        ),
        (
            vec![
                "--config".into(),
                dir.join("missing.toml").display().to_string(),
                "status".into(),
            ],
            "cannot read",
        ),
        (config("bad.toml", "[store\nurl = 1\n", "status"), "TOML"),
        (
            config(
                "duration.toml",
                "[store]\nurl = \"sqlite::memory:\"\n[relay]\nlease = \"soon\"\n",
                "status",
            ),
            "relay.lease: not a duration",
        ),
        (
            config(
                "route.toml",
                "[store]\nurl = \"sqlite::memory:\"\n[routes.x]\nurl = \"gopher://example.com\"\n",
                "relay",
            ),
            "unsupported sink URL",
        ),
        (
            vec![
                "--store".into(),
                "sqlite::memory:".into(),
                "--table".into(),
                "x; DROP".into(),
                "status".into(),
            ],
            "invalid SQL identifier",
        ),
        (vec!["status".into()], "no store"),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = outbox_cmd(&args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line, got {err:?}"
        );
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(!err.contains("hunter2"), "passwords never appear: {err}");
    }
}

/// `outbox config check` on malformed configurations: each fails with one line that names
/// the setting (and, for a variable, the variable), never quotes a secret, and reaches no
/// server; a good configuration, from a file or from the environment alone, passes.
#[test]
fn config_check_names_the_setting_of_every_malformed_config() {
    let dir = tempfile::tempdir().unwrap();
    let store = "[store]\nurl = \"sqlite::memory:\"\n";
    let route =
        |rest: &str| format!("{store}[routes.x]\nurl = \"https://hooks.example.com/x\"\n{rest}");
    // (the file, variables set over it, what the one error line must name)
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, &'a [&'a str]);
    let cases: Vec<Case<'_>> = vec![
        ("[relay]\nbatch_size = 10\n".into(), vec![], &["store"]),
        ("[store]\nurl = 7\n".into(), vec![], &["store.url"]),
        (
            "[store]\nurl = \"ftp://hunter2@example.com\"\n".into(),
            vec![],
            &["store.url"],
        ),
        (format!("{store}table = \"x; DROP\"\n"), vec![], &["table"]),
        (
            format!("{store}max_connections = \"big\"\n"),
            vec![],
            &["store.max_connections"],
        ),
        (format!("{store}colour = \"red\"\n"), vec![], &["colour"]),
        (
            format!("{store}[relay]\nbatch_size = 0\n"),
            vec![],
            &["batch_size"],
        ),
        (
            format!("{store}[relay]\nbatch_size = \"ten\"\n"),
            vec![],
            &["relay.batch_size"],
        ),
        (
            format!("{store}[relay]\nconcurrency = 0\n"),
            vec![],
            &["concurrency"],
        ),
        (
            format!("{store}[relay]\nlease = \"soon\"\n"),
            vec![],
            &["relay.lease"],
        ),
        (
            format!("{store}[relay]\nlease = \"5ms\"\n"),
            vec![],
            &["lease"],
        ),
        (
            format!("{store}[relay]\npoll_interval = \"0s\"\n"),
            vec![],
            &["poll_interval"],
        ),
        (
            format!("{store}[relay]\nordering = \"sideways\"\n"),
            vec![],
            &["relay.ordering"],
        ),
        (
            format!("{store}[relay]\nbatchsize = 10\n"),
            vec![],
            &["batchsize"],
        ),
        (
            format!("{store}[retry]\nmax_attempts = -1\n"),
            vec![],
            &["retry.max_attempts"],
        ),
        (
            format!("{store}[retry]\ninitial_delay = \"1\"\n"),
            vec![],
            &["retry.initial_delay"],
        ),
        (
            format!("{store}[routes.x]\nstream = \"s\"\n"),
            vec![],
            &["routes.x"],
        ),
        (
            format!("{store}[routes.x]\nurl = \"gopher://example.com\"\n"),
            vec![],
            &["routes.x.url"],
        ),
        (
            format!("{store}[routes.\"bad name\"]\nurl = \"https://hooks.example.com/x\"\n"),
            vec![],
            &["bad name"],
        ),
        (
            route("rate_limit = { per_second = 0 }\n"),
            vec![],
            &["rate_limit"],
        ),
        (route("circuit = { failures = 0 }\n"), vec![], &["circuit"]),
        (route("concurrency = 0\n"), vec![], &["concurrency"]),
        (route("timeout = \"0s\"\n"), vec![], &["timeout"]),
        (route("nonsense = 1\n"), vec![], &["nonsense"]),
        (route("max_in_flight = 0\n"), vec![], &["max_in_flight"]),
        (
            route("secrets_env = \"OUTBOX_TEST_UNSET_SECRET\"\n"),
            vec![],
            &["secrets_env"],
        ),
        (
            format!("{store}[routes.x]\nurl = \"http://127.0.0.1:9/hook\"\n"),
            vec![],
            &["url"],
        ),
        (
            format!(
                "{store}[routes.x]\nurl = \"redis://127.0.0.1:6379/\"\nstream = \"s.{{evnt}}\"\n"
            ),
            vec![],
            &["stream"],
        ),
        (
            format!(
                "{store}[routes.x]\nurl = \"nats://127.0.0.1:4222\"\nsubject = \"s.{{evnt}}\"\n"
            ),
            vec![],
            &["subject"],
        ),
        (
            format!("{store}[routes.x]\nurl = \"mqtt://127.0.0.1:1883\"\ntopic = \"t/{{evnt}}\"\n"),
            vec![],
            &["topic"],
        ),
        (
            format!(
                "{store}[routes.x]\nurl = \"amqp://127.0.0.1:5672/%2f\"\nrouting_key = \"k.{{evnt}}\"\n"
            ),
            vec![],
            &["routing_key"],
        ),
        (
            format!("{store}[routes.x]\nurl = \"kafka://127.0.0.1:9092/t.{{evnt}}\"\n"),
            vec![],
            &["topic"],
        ),
        (
            format!("{store}[routes.x]\nurl = \"sqs://\"\n"),
            vec![],
            &["url"],
        ),
        (
            format!("{store}[dashboard]\ntoken_env = \"OUTBOX_TEST_UNSET_TOKEN\"\n"),
            vec![],
            &["dashboard.token_env"],
        ),
        (
            format!(
                "{store}[dashboard]\ntoken = \"0123456789abcdef0\"\npublic_read = true\nlisten = \"0.0.0.0:9465\"\n"
            ),
            vec![],
            &["dashboard.hosts"],
        ),
        (
            format!("{store}[health]\nmax_pending_age = \"x\"\n"),
            vec![],
            &["health.max_pending_age"],
        ),
        (
            format!("{store}[metrics]\nlisten = 5\n"),
            vec![],
            &["metrics.listen"],
        ),
        (
            route(""),
            vec![("OUTBOX_RELAY__BATCH_SIZE", "abc")],
            &["OUTBOX_RELAY__BATCH_SIZE", "relay.batch_size"],
        ),
        (
            route(""),
            vec![("OUTBOX_RELAY__NOPE", "1")],
            &["OUTBOX_RELAY__NOPE", "nope"],
        ),
        (
            route(""),
            vec![("OUTBOX_STORE_URL", "postgres://u:hunter2@db/x")],
            &["OUTBOX_STORE_URL", "OUTBOX_STORE__URL"],
        ),
    ];
    let mut wrong = Vec::new();
    for (i, (text, env, needles)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let out = outbox_test_support::output_within(
            "outbox config check",
            Duration::from_secs(30),
            Command::new(env!("CARGO_BIN_EXE_outbox"))
                .args(["--config", path.to_str().unwrap(), "config", "check"])
                .env_remove("OUTBOX_CONFIG")
                .env_remove("RUST_LOG")
                .envs(env.iter().copied()),
        );
        // Warnings may come first (an HTTP route without secrets says so); the error is
        // the last line, and the only one.
        let err = stderr(&out);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        let named = errors
            .first()
            .is_some_and(|e| needles.iter().all(|n| e.contains(n)));
        if out.status.success()
            || !named
            || errors.len() != 1
            || !err.trim_end().ends_with(errors[0])
            || err.contains("hunter2")
        {
            wrong.push(format!(
                "{text:?} {env:?} → {:?} {err:?} (wanted {needles:?})",
                out.status.code()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );

    let good = dir.path().join("good.toml");
    std::fs::write(&good, route("rate_limit = { per_second = 50 }\n")).unwrap();
    let ok = outbox_cmd(&["--config", good.to_str().unwrap(), "config", "check"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert_eq!(stdout(&ok), "config ok: a sqlite store, 1 route(s): x\n");

    let from_env = outbox_test_support::output_within(
        "outbox config check",
        Duration::from_secs(30),
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["config", "check"])
            .env_remove("OUTBOX_CONFIG")
            .env("OUTBOX_STORE__URL", "sqlite::memory:")
            .env("OUTBOX_ROUTES__HOOKS__URL", "https://hooks.example.com/x"),
    );
    assert!(from_env.status.success(), "{}", stderr(&from_env));
    assert_eq!(
        stdout(&from_env),
        "config ok: a sqlite store, 1 route(s): hooks\n"
    );

    // A variable meant as a setting, and nothing else: the error says why it is not one.
    let stray_only = outbox_test_support::output_within(
        "outbox config check",
        Duration::from_secs(30),
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["config", "check"])
            .env_remove("OUTBOX_CONFIG")
            .env("OUTBOX_STORE_URL", "sqlite::memory:"),
    );
    let err = stderr(&stray_only);
    assert!(!stray_only.status.success());
    assert!(
        err.contains("needs --config FILE") && err.contains("as in OUTBOX_STORE__URL"),
        "{err}"
    );
}

/// Runs a database client; panics with its output unless it succeeds.
fn client(program: &str, args: &[&str]) {
    let out = outbox_test_support::output_within(
        program,
        Duration::from_secs(60),
        Command::new(program).args(args),
    );
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The printed schema for `store` and `table`, written to a file in `dir`; printing
/// connects to nothing.
fn printed_schema(dir: &std::path::Path, store: &str, table: &str) -> std::path::PathBuf {
    let out = outbox_cmd(&["--store", store, "--table", table, "migrate", "--print"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let script = stdout(&out);
    assert!(script.contains(table), "{script}");
    let path = dir.join(format!("{table}.sql"));
    std::fs::write(&path, script).unwrap();
    path
}

/// After the script, `outbox migrate` runs cleanly over it and a row with only
/// destination, event type and payload is pending.
fn migrate_then_one_pending_row(store: &str, table: &str) {
    let out = outbox_cmd(&["--store", store, "--table", table, "migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = outbox_cmd(&["--store", store, "--table", table, "status", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        status["destinations"][0]["destination"], "orders",
        "{status}"
    );
    assert_eq!(status["destinations"][0]["pending"], 1, "{status}");
}

/// `outbox migrate --print` writes the DDL a team applies with its own tool: psql and the
/// mysql client take it as it is, and so does SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_schema_applies_with_the_database_clients() {
    let dir = tempfile::tempdir().unwrap();
    let minimal = |table: &str, payload: &str| {
        format!(
            "INSERT INTO {table} (destination, event_type, payload) VALUES ('orders', 'order.paid', {payload})"
        )
    };

    let pg = url();
    let table = format!("printed_{:016x}", fastrand::u64(..));
    let script = printed_schema(dir.path(), "postgres://nobody@192.0.2.1/none", &table);
    let psql = |args: &[&str]| {
        client(
            "psql",
            &[&["-q", "-v", "ON_ERROR_STOP=1", &pg], args].concat(),
        )
    };
    psql(&["-f", script.to_str().unwrap()]);
    psql(&["-c", &minimal(&table, "'\\x7b7d'")]);
    migrate_then_one_pending_row(&pg, &table);

    let my = std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let parsed = url::Url::parse(&my).unwrap();
    let table = format!("printed_{:016x}", fastrand::u64(..));
    let script = printed_schema(dir.path(), "mysql://nobody@192.0.2.1/none", &table);
    let (host, port) = (
        parsed.host_str().unwrap(),
        parsed.port().unwrap_or(3306).to_string(),
    );
    let database = parsed.path().trim_start_matches('/');
    let password = format!("--password={}", parsed.password().unwrap_or(""));
    let mysql = |sql: &str| {
        client(
            "mysql",
            &[
                "-h",
                host,
                "-P",
                &port,
                "-u",
                parsed.username(),
                &password,
                database,
                "-e",
                sql,
            ],
        );
    };
    mysql(&format!("source {}", script.display()));
    mysql(&minimal(&table, "'{}'"));
    migrate_then_one_pending_row(&my, &table);
    mysql(&format!(
        "DROP TABLE {table}; DROP TABLE {table}_keys; DROP FUNCTION {table}_uuidv7; \
         DROP FUNCTION {table}_key; DROP PROCEDURE {table}_enqueue; \
         DELETE FROM outbox_migrations WHERE id LIKE '{table}/%'"
    ));

    let file = dir.path().join("printed.db");
    let sqlite = format!("sqlite:{}", file.display());
    let script = printed_schema(dir.path(), &sqlite, "outbox");
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    sqlx::raw_sql(&std::fs::read_to_string(script).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(&minimal("outbox", "X'7b7d'"))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    migrate_then_one_pending_row(&sqlite, "outbox");
}

/// A purge of many batches prints one summary line and, off a terminal, no progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_in_batches_and_prints_one_line() {
    let (outbox, table) = outbox_table().await;
    outbox.migrate().await.unwrap();
    let mut messages: Vec<NewMessage> = outbox::testkit::numbered("sms", "order.paid", 2500);
    let mut fates = vec![Fate::Published; messages.len()];
    messages.push(NewMessage::builder("sms", "kept").json(&0).build().unwrap());
    fates.push(Fate::Pending);
    common::settle(&outbox, &messages, &fates).await;

    let out = outbox_cmd(&[
        "--store",
        &url(),
        "--table",
        &table,
        "purge",
        "--published-older-than",
        "0s",
        "--batch",
        "100",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "purged 2500 rows\n");
    assert_eq!(stderr(&out), "", "no progress lines off a terminal");
    let left: Vec<String> = sqlx::query_scalar(&format!("SELECT status::text FROM {table}"))
        .fetch_all(outbox.pool())
        .await
        .unwrap();
    assert_eq!(
        left,
        vec!["pending".to_owned()],
        "only the unfinished row is left"
    );
}

/// `RUST_LOG` selects log lines on stderr, as text or JSON; a bad `RUST_LOG` is a one-line
/// error; without it nothing but warnings is logged.
#[test]
fn rust_log_selects_what_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("log.db").display());
    let with_env = |vars: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
        command
            .args(["--store", &store, "migrate"])
            .env_remove("OUTBOX_CONFIG")
            .env_remove("RUST_LOG")
            .env_remove("OUTBOX_LOG_FORMAT")
            .envs(vars.iter().copied());
        outbox_test_support::output_within("outbox migrate", Duration::from_secs(60), &mut command)
    };

    let quiet = with_env(&[]);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert_eq!(stderr(&quiet), "", "nothing below a warning by default");

    let plain = with_env(&[("RUST_LOG", "debug")]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(
        stderr(&plain).lines().any(|l| l.contains("DEBUG")),
        "debug lines: {}",
        stderr(&plain)
    );

    let json = with_env(&[("RUST_LOG", "debug"), ("OUTBOX_LOG_FORMAT", "json")]);
    assert!(json.status.success(), "{}", stderr(&json));
    let lines: Vec<serde_json::Value> = stderr(&json)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    assert!(!lines.is_empty(), "JSON log lines");
    assert!(lines.iter().all(|l| l["level"].is_string()), "{lines:?}");

    let bad = with_env(&[("RUST_LOG", "outbox=loud")]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).starts_with("error: RUST_LOG:"),
        "{}",
        stderr(&bad)
    );
    assert_eq!(stderr(&bad).lines().count(), 1, "{}", stderr(&bad));
}

/// With `--log-format json`, every line a relay writes is a JSON object: the lines about
/// the process itself (serving, running, stopped) too, and a failure's one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_hold_every_line_of_a_relay() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outbox.toml");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite:{}\"\n\n[metrics]\nlisten = \"{metrics}\"\n\n[routes.hooks]\nurl = \"https://hooks.example.com/x\"\n",
            dir.path().join("outbox.db").display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    assert!(
        outbox_cmd(&["--config", config, "migrate"])
            .status
            .success()
    );
    let log_path = dir.path().join("relay.log");
    let mut relay = outbox_test_support::ChildGuard::spawn(
        "outbox relay",
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["--config", config, "--log-format", "json", "relay"])
            .env_remove("OUTBOX_CONFIG")
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap()),
    );
    let read = || std::fs::read_to_string(&log_path).unwrap_or_default();
    outbox_test_support::wait_until("the relay to start", Duration::from_secs(30), || async {
        read().contains("relay running")
    })
    .await;
    assert!(
        relay.terminate(Duration::from_secs(20)).is_some(),
        "graceful stop"
    );
    let messages: Vec<String> = read()
        .lines()
        .map(|l| {
            let line: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}"));
            line["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    for expected in ["serving /metrics", "relay running", "relay stopped"] {
        assert!(
            messages.iter().any(|m| m.starts_with(expected)),
            "{expected:?} among {messages:?}"
        );
    }

    let failed = outbox_cmd(&[
        "--log-format",
        "json",
        "--store",
        "ftp://example.com",
        "status",
    ]);
    assert!(!failed.status.success());
    let line: serde_json::Value = serde_json::from_str(stderr(&failed).trim_end())
        .unwrap_or_else(|e| panic!("{:?} is not one JSON line: {e}", stderr(&failed)));
    assert_eq!(line["level"], "ERROR");
    assert!(
        line["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unsupported store URL")),
        "{line}"
    );
}

/// The AWS SDK logs the access key id of static credentials (at info, debug and trace).
/// With `RUST_LOG=trace`, an SQS route's start-up (its queue is read, so the SDK resolves
/// and signs with the credentials) logs plenty, and never the key id: the CLI keeps the
/// SDK's crates at `warn` unless `RUST_LOG` names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqs_access_key_id_stays_out_of_trace_logs() {
    const KEY_ID: &str = "AKIAOUTBOXLEAKCHECK7";
    let endpoint = std::env::var("OUTBOX_TEST_SQS_ENDPOINT")
        .unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outbox.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite:{}\"\n\n[routes.queue]\nurl = \"sqs+{endpoint}/123456789012/outbox-test\"\nregion = \"us-east-1\"\naccess_key_id = \"{KEY_ID}\"\nsecret_access_key = \"test-secret-key\"\n",
            dir.path().join("outbox.db").display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let migrated = outbox_cmd(&["--config", config, "migrate"]);
    assert!(migrated.status.success(), "{}", stderr(&migrated));

    let log_path = dir.path().join("relay.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let _relay = outbox_test_support::ChildGuard::spawn(
        "outbox relay",
        Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["--config", config, "relay"])
            .env_remove("OUTBOX_CONFIG")
            .env("RUST_LOG", "trace")
            .stdout(std::process::Stdio::null())
            .stderr(log),
    );
    let read = || std::fs::read_to_string(&log_path).unwrap_or_default();
    outbox_test_support::wait_until(
        "the relay to start its SQS route (moto from scripts/services.sh; OUTBOX_TEST_SQS_ENDPOINT)",
        Duration::from_secs(60),
        || async { read().contains("relay running") },
    )
    .await;
    // A few claims and their trace lines.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let logged = read();
    let server = endpoint.trim_start_matches("http://").trim_end_matches('/');
    assert!(
        logged.contains(" TRACE ") && logged.contains(&format!("connected to {server}")),
        "trace logging is on and shows the SDK reaching SQS: {logged}"
    );
    assert!(
        !logged.contains(KEY_ID),
        "the access key id was logged:\n{logged}"
    );
}
