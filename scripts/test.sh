#!/usr/bin/env bash
# The project's one test command: starts the servers the tests need (scripts/services.sh),
# then checks formatting, lints, docs and architecture invariants, and runs every test in
# the workspace. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "services"
# Start (or install) the servers the tests need; keep URLs the caller already exported.
while IFS='=' read -r name value; do
    if [[ -z ${!name:-} ]]; then export "$name=$value"; fi
    echo "$name=${!name}"
done < <(bash scripts/services.sh)

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings denied)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "docs (broken links denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet

step "architecture invariants"
scripts/check-architecture.sh

step "feature gating (front crate without the redis feature)"
cargo test -p outbox --features http --test readme_config

step "tests"
log=$(mktemp)
set +e
cargo test --workspace --all-features 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole run, summed over every test binary and doctest.
awk '/^test result:/ { for (i = 2; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "\n%d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
exit "$status"
