//! The SSRF guard end to end: address spellings, names that resolve to loopback, DNS
//! answers that change, with a canary listener that must see no connection.
//!
//! Only forms that reach *this machine* (loopback, unspecified) are ever handed to a
//! sink that could send: every other blocked range is checked without any I/O, so a
//! broken guard can never send a packet to a private or public address from a test.

mod common;

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Canary, Reply, TestServer, message};
use outbox_engine::layers::{CircuitConfig, CircuitState, SinkExt};
use outbox_engine::testkit::publish;
use outbox_engine::{BoxFuture, FailureClass, Outcome};
use outbox_sink_http::HttpSinkConfig;
use outbox_sink_http::ssrf::{Lookup, SsrfPolicy, SystemLookup};

/// A resolver with fixed answers, counting its calls.
#[derive(Clone, Default)]
struct FakeDns {
    answers: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
    calls: Arc<AtomicUsize>,
}

impl FakeDns {
    fn set(&self, name: &str, addrs: &[&str]) {
        let addrs = addrs.iter().map(|a| a.parse().unwrap()).collect();
        self.answers.lock().unwrap().insert(name.to_owned(), addrs);
    }
}

impl Lookup for FakeDns {
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self.answers.lock().unwrap().get(host).cloned();
        Box::pin(async move {
            answer.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
        })
    }
}

/// URL hosts that all reach this machine when connected to.
const LOOPBACK_LITERALS: &[&str] = &[
    "127.0.0.1",
    "127.0.0.1.",
    "2130706433",
    "2130706434",
    "0177.0.0.1",
    "0177.0000.0000.0001",
    "017700000001",
    "0x7f000001",
    "0X7F000001",
    "0x7f.0x0.0x0.0x1",
    "0x7f.1",
    "0177.1",
    "127.1",
    "127.0.1",
    "127.000.000.001",
    "127.16777215",
    "127.0.0.2",
    "127.127.127.127",
    "%31%32%37%2E%30%2E%30%2E%31",
    "１２７．０．０．１",
    "0",
    "0.0.0.0",
    "0x0",
    "00000",
    "0.0.0.0.",
    "[::1]",
    "[0:0:0:0:0:0:0:1]",
    "[0000:0000:0000:0000:0000:0000:0000:0001]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "[::]",
    "[::ffff:0.0.0.0]",
];

/// Names that resolve to this machine: by name (refused before resolving) or through
/// the system resolver.
const LOOPBACK_NAMES: &[&str] = &[
    "localhost",
    "LOCALHOST",
    "localhost.",
    "LocalHost.",
    "api.localhost",
    "a.b.localhost",
];

/// Blocked ranges elsewhere: checked at build time only, never connected to.
const ELSEWHERE: &[&str] = &[
    "10.0.0.1",
    "0x0a000001",
    "167772161",
    "012.0.0.1",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.0.1",
    "0xc0a80001",
    "3232235521",
    "100.64.0.1",
    "100.100.100.200",
    "169.254.169.254",
    "0xa9fea9fe",
    "2852039166",
    "0251.0376.0251.0376",
    "169.254.170.2",
    "192.0.0.192",
    "192.0.2.1",
    "198.18.0.1",
    "198.51.100.1",
    "203.0.113.1",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "[::ffff:169.254.169.254]",
    "[::ffff:a9fe:a9fe]",
    "[::ffff:10.0.0.1]",
    "[::127.0.0.1]",
    "[64:ff9b::a9fe:a9fe]",
    "[64:ff9b::127.0.0.1]",
    "[2002:a9fe:a9fe::]",
    "[2002:7f00:1::]",
    "[fd00:ec2::254]",
    "[fc00::1]",
    "[fe80::1]",
    "[fec0::1]",
    "[ff02::1]",
    "[2001:db8::1]",
    "[100::1]",
];

/// Tries to deliver one message with `config` (the default guard unless it says
/// otherwise); returns the refusal.
async fn refusal(config: HttpSinkConfig) -> String {
    let url = config.url.clone();
    let sink = match config.build() {
        Err(err) => {
            assert_eq!(err.setting(), "url", "{err}");
            assert!(err.reason().contains("SSRF guard refused"), "{url}: {err}");
            return format!("build: {err}");
        }
        Ok(sink) => sink,
    };
    let outcomes = publish(&sink, &[message("t", 1)]).await;
    match &outcomes[..] {
        [Outcome::Failed(f)] => {
            assert_eq!(
                (f.class, f.retryable),
                (FailureClass::Config, false),
                "{url}: {f}"
            );
            assert!(f.message.contains("SSRF guard refused"), "{url}: {f}");
            format!("publish: {f}")
        }
        other => panic!("{url} was not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_address_forms_never_reach_the_canary() {
    let canary = Canary::start().await;
    let port = canary.port;
    let dns = FakeDns::default();
    // Names whose (fake) DNS answer is a loopback or unspecified address.
    let fake_names: &[(&str, &[&str])] = &[
        ("evil.example", &["127.0.0.1"]),
        ("v6.evil.example", &["::1"]),
        ("mapped.evil.example", &["::ffff:127.0.0.1"]),
        ("zero.evil.example", &["0.0.0.0"]),
        ("unspecified6.evil.example", &["::"]),
        ("loopback-range.evil.example", &["127.3.2.1"]),
    ];
    for (name, addrs) in fake_names {
        dns.set(name, addrs);
    }
    let mut refused = Vec::new();

    for host in LOOPBACK_LITERALS.iter().chain(LOOPBACK_NAMES) {
        let url = format!("http://{host}:{port}/steal");
        assert!(
            url::Url::parse(&url).is_ok(),
            "{url} must parse for the check to mean anything"
        );
        refused.push((url.clone(), refusal(HttpSinkConfig::new(&url)).await));
    }
    for (name, _) in fake_names {
        let url = format!("http://{name}:{port}/steal");
        refused.push((
            url.clone(),
            refusal(HttpSinkConfig::new(&url).lookup(dns.clone())).await,
        ));
    }
    // The machine's own name, through the system resolver, when it maps to this machine
    // (Debian-style /etc/hosts).
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let hostname = hostname.trim();
    match SystemLookup.lookup(hostname).await {
        Ok(addrs)
            if !hostname.is_empty()
                && !addrs.is_empty()
                && addrs.iter().all(|a| a.is_loopback()) =>
        {
            let url = format!("http://{hostname}:{port}/steal");
            refused.push((url.clone(), refusal(HttpSinkConfig::new(&url)).await));
        }
        other => eprintln!(
            "note: host name {hostname:?} does not resolve to loopback ({other:?}); not tested"
        ),
    }
    for host in ELSEWHERE {
        let url = format!("http://{host}:{port}/steal");
        let result = HttpSinkConfig::new(&url).build();
        let err = result
            .err()
            .unwrap_or_else(|| panic!("{url} was accepted (and will not be sent to)"));
        assert!(err.reason().contains("SSRF guard refused"), "{url}: {err}");
        refused.push((url, format!("build: {err}")));
    }

    for (url, why) in &refused {
        eprintln!("{url:60} {why}");
    }
    assert!(refused.len() >= 80, "{} forms", refused.len());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(canary.connections(), 0, "the canary was reached");

    // Control: the same spelling with the guard off does reach the canary, so a zero
    // above means the guard held, not that the canary was deaf.
    let open = HttpSinkConfig::new(format!("http://2130706433:{port}/"))
        .ssrf(SsrfPolicy::disabled())
        .build()
        .unwrap();
    let _ = publish(&open, &[message("t", 1)]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(canary.connections() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_is_refused_when_any_of_its_addresses_is_blocked() {
    let canary = Canary::start().await;
    let dns = FakeDns::default();
    // 127.0.0.2 is allowed, 127.0.0.1 is not: filtering the answer down to the allowed
    // address would still follow a rebinding attacker's lead, so the name is refused.
    dns.set("mixed.example", &["127.0.0.2", "127.0.0.1"]);
    let config = HttpSinkConfig::new(format!("http://mixed.example:{}/", canary.port))
        .ssrf(SsrfPolicy::default().allow("127.0.0.2/32").unwrap())
        .lookup(dns.clone());
    let why = refusal(config).await;
    assert!(why.contains("127.0.0.1 (loopback)"), "{why}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(canary.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_go_to_the_checked_address_and_each_new_one_is_checked_again() {
    // Every answer closes the connection, so each request resolves again.
    let server = TestServer::with(|_, _| Reply::ok().header("connection", "close")).await;
    let dns = FakeDns::default();
    dns.set("hooks.example", &["127.0.0.1"]);
    // Behind a circuit breaker, to see what the refusal does to the route's health.
    let sink = common::sink(
        common::config(format!("http://hooks.example:{}/in", server.addr.port()))
            .lookup(dns.clone()),
    )
    .circuit_breaker(CircuitConfig::default().failures(1));

    // The name exists only in the fake resolver, so arriving at the server proves the
    // connection used the checked answer.
    assert!(publish(&sink, &[message("t", 1)]).await[0].is_published());
    let first = &server.requests()[0];
    assert_eq!(
        first.header("host"),
        Some(&*format!("hooks.example:{}", server.addr.port()))
    );

    // The name now "rebinds" to a blocked address: the next connection is refused.
    dns.set("hooks.example", &["127.0.0.9"]);
    let outcomes = publish(&sink, &[message("t", 2)]).await;
    match &outcomes[..] {
        [Outcome::Failed(f)] => {
            assert_eq!((f.class, f.retryable), (FailureClass::Config, false), "{f}");
            assert!(
                f.message
                    .contains("`hooks.example`: it resolves to 127.0.0.9 (loopback)"),
                "{f}"
            );
        }
        other => panic!("rebinding was not refused: {other:?}"),
    }
    assert_eq!(server.count(), 1);
    assert!(
        dns.calls.load(Ordering::SeqCst) >= 2,
        "the second connection resolved again"
    );
    // An SSRF refusal is permanent, so it does not count against the route: with a
    // breaker that opens at the first retryable failure, the route stays closed.
    let health = sink.health();
    assert_eq!(
        (health.circuit, health.consecutive_failures),
        (CircuitState::Closed, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_lists_apply_per_route() {
    let server = TestServer::start().await;
    let url = server.url("/");
    // The default policy allows nothing private; this route allows the test server.
    let internal = HttpSinkConfig::new(&url)
        .allow("127.0.0.1/32")
        .build()
        .unwrap();
    assert!(publish(&internal, &[message("internal", 1)]).await[0].is_published());
    // Another route to the same address without the entry is refused when it is built.
    let err = HttpSinkConfig::new(&url).build().unwrap_err();
    assert_eq!(err.setting(), "url", "{err}");
    assert!(err.reason().contains("SSRF guard refused"), "{err}");

    // A host allow entry lets a name through whatever it resolves to; other names
    // with the same answer are still refused.
    let dns = FakeDns::default();
    dns.set("db.internal", &["127.0.0.1"]);
    dns.set("db.elsewhere", &["127.0.0.1"]);
    let port = server.addr.port();
    let route = |host: &str| {
        HttpSinkConfig::new(format!("http://{host}:{port}/"))
            .ssrf(SsrfPolicy::default().allow("*.internal").unwrap())
            .lookup(dns.clone())
            .build()
            .unwrap()
    };
    let named = publish(&route("db.internal"), &[message("named", 2)]).await;
    assert!(named[0].is_published(), "{named:?}");
    let other = publish(&route("db.elsewhere"), &[message("other", 3)]).await;
    assert!(
        matches!(&other[0], Outcome::Failed(f) if f.message.contains("db.elsewhere")),
        "{other:?}"
    );
    assert_eq!(server.count(), 2);
}
