#!/usr/bin/env bash
# Architecture Invariant: outbox-engine depends on no database or broker client.
set -euo pipefail
cd "$(dirname "$0")/.."

forbidden='^(sqlx|sqlx-[a-z-]+|diesel|diesel_[a-z_]+|reqwest|hyper|rdkafka|rdkafka-sys|lapin|amq-protocol|redis|aws-[a-z-]+|tokio-postgres|postgres|mysql[a-z_-]*|rusqlite|libsqlite3-sys)$'
deps=$(cargo tree -p outbox-engine -e normal --all-features --prefix none --format '{p}' | cut -d' ' -f1 | sort -u)
bad=$(grep -E "$forbidden" <<<"$deps" || true)
if [[ -n "$bad" ]]; then
    echo "outbox-engine must not depend on database or broker crates; found:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "outbox-engine: $(wc -l <<<"$deps") crates in its normal dependency tree, none of them a database or broker client"
