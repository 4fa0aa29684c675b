#!/usr/bin/env bash
# Architecture invariants: the core, the webhook receiver and the dashboard depend on no
# database, broker or HTTP client, so a service that only receives compiles none of them,
# and the dashboard works over any store.
set -euo pipefail
cd "$(dirname "$0")/.."

forbidden='^(sqlx|sqlx-[a-z-]+|diesel|diesel_[a-z_]+|reqwest|hyper|hyper-util|rdkafka|rdkafka-sys|lapin|amq-protocol|async-nats|rumqttc|redis|aws-[a-z-]+|tokio-postgres|postgres|mysql[a-z_-]*|rusqlite|libsqlite3-sys)$'

# check CRATE CARGO-TREE-ARGS...: CRATE's normal dependency tree holds no forbidden crate.
check() {
    local crate=$1
    shift
    local deps bad
    deps=$(cargo tree -p "$crate" -e normal "$@" --prefix none --format '{p}' | cut -d' ' -f1 | sort -u)
    bad=$(grep -E "$forbidden" <<<"$deps" || true)
    if [[ -n "$bad" ]]; then
        echo "$crate ($*) must not depend on database, broker or HTTP client crates; found:" >&2
        echo "$bad" >&2
        exit 1
    fi
    echo "$crate ($*): $(wc -l <<<"$deps") crates in its normal dependency tree, no database, broker or HTTP client"
}

check outbox-engine --all-features
check outbox-receiver --all-features
# The dashboard reads any store through the core's traits.
check outbox-dashboard --all-features
# The front crate with only the receiver's features: the receiving side of a service.
check outbox --no-default-features --features receiver-axum

# The check can fail: it must find the HTTP client the HTTP sink is built on.
if (check outbox-sink-http) >/dev/null 2>&1; then
    echo "the invariant check found no HTTP client in outbox-sink-http: the check is broken" >&2
    exit 1
fi

# The README's first command, `cargo run --example quickstart` at the root, builds the
# default members (the examples package alone, default features) with their dev and build
# dependencies: no system library (libpq, libmysqlclient), no C broker client, no AWS SDK.
quickstart_forbidden='^(mysqlclient-sys|pq-sys|rdkafka-sys|rdkafka|lapin|async-nats|rumqttc|aws-sdk-[a-z]+|diesel|diesel-async|opentelemetry[a-z_-]*)$'
quickstart=$(cargo tree -e normal,build,dev --prefix none --format '{p}' | cut -d' ' -f1 | sort -u)
bad=$(grep -E "$quickstart_forbidden" <<<"$quickstart" || true)
if [[ -n $bad ]]; then
    echo "cargo run --example quickstart would build what the quickstart does not use:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "quickstart: $(wc -l <<<"$quickstart") crates, none of them a system-library binding, broker client or AWS SDK"
# ... and the same check finds them in the workload examples.
workloads=$(cargo tree -p outbox-examples --features workloads -e normal --prefix none --format '{p}' | cut -d' ' -f1)
if ! grep -qE "$quickstart_forbidden" <<<"$workloads"; then
    echo "the quickstart check found nothing in the workload examples: the check is broken" >&2
    exit 1
fi
