#!/usr/bin/env bash
# The project's one test command: formatting, lints, docs, architecture invariants, and
# every test in the workspace. CI (.ci/run) runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings denied)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "docs (broken links denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet

step "architecture invariants"
scripts/check-architecture.sh

step "tests"
cargo test --workspace --all-features
