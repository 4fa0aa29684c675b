#!/usr/bin/env bash
# Before a release: compares the public API of every published crate with the last
# release tag (or the git revision given) and fails on a change that needs a bigger
# version bump than the one in Cargo.toml. Installs cargo-semver-checks once per machine.
#
#   scripts/semver-check.sh            against the newest `v*` tag
#   scripts/semver-check.sh REV        against a git revision
set -euo pipefail
cd "$(dirname "$0")/.."

baseline=${1:-$(git tag --list 'v*' --sort=-version:refname | head -1)}
if [[ -z $baseline ]]; then
    echo "no release tag (v*) yet: nothing to compare with; pass a git revision to compare with it" >&2
    exit 0
fi
if ! cargo semver-checks --version >/dev/null 2>&1; then
    echo "installing cargo-semver-checks (once per machine)"
    cargo install cargo-semver-checks --locked
fi
# Published crates only (`publish = false` ones have no users to break).
mapfile -t packages < <(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") != []:
        print(p["name"])')
args=()
for package in "${packages[@]}"; do args+=(--package "$package"); done
exec cargo semver-checks check-release --baseline-rev "$baseline" --all-features "${args[@]}"
