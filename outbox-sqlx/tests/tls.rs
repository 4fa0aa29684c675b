//! With the `tls` feature, the store URL's `sslmode` applies: `require` encrypts the
//! connection (PostgreSQL's own view, `pg_stat_ssl`, says so), and `verify-full` checks
//! the server's certificate, refusing a self-signed one with an error that says why.
//!
//! Needs a PostgreSQL with `ssl = on`: Debian's cluster, which `scripts/services.sh`
//! starts, has it with its self-signed certificate.

use outbox_engine::StoreSettings;
use outbox_engine::registry::UrlStore;
use outbox_sqlx::postgres::PgOutbox;

const URL_VAR: &str = "OUTBOX_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn with_sslmode(mode: &str) -> String {
    let url = outbox_test_support::server_url(URL_VAR, DEFAULT_URL);
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}sslmode={mode}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_and_verify_full_checks_the_certificate() {
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let url = with_sslmode("require");
        let store = PgOutbox::connect(&StoreSettings::new(url.clone()))
            .await
            .unwrap_or_else(|e| {
                panic!("PostgreSQL with sslmode=require at {URL_VAR} ({e}): this test needs a server with ssl = on (scripts/services.sh starts Debian's, which has it)")
            });
        let encrypted: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert!(encrypted, "the connection is encrypted");

        // The server's certificate is self-signed: full verification refuses it.
        let refused = PgOutbox::connect(&StoreSettings::new(with_sslmode("verify-full")))
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            refused.to_ascii_lowercase().contains("certificate")
                || refused.to_ascii_lowercase().contains("issuer"),
            "a refusal that names the certificate: {refused}"
        );
    })
    .await
    .expect("the test ends within 60 s");
}
