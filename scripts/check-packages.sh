#!/usr/bin/env bash
# Every library crate packages, and compiles from its package alone with its default
# features: the files it reads at build time (`include_str!`, SQL migrations) are in the
# package, its manifest survives cargo's rewriting for the registry, and it does not lean
# on a feature that another workspace member turns on.
#
# `cargo publish --dry-run` checks the same by building (code generation and all) every
# package in an ephemeral workspace of its own. This script packs with `cargo package
# --no-verify`, unpacks the packages into one scratch workspace whose crates point at each
# other by path (what the registry would give them), and runs `cargo check` once per
# package there, so that each sees only its own features while the dependencies' checks
# are shared. Output in $CARGO_TARGET_DIR/package-check (kept between runs).
set -euo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$PWD/$target
scratch=$target/package-check/crates
rm -rf "$target/package" "$scratch"
mkdir -p "$scratch"

# name version of every package that is published (`publish = false` ones are not), and
# each one's crates.io metadata: a package without one of these fields fails here.
listing=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys
missing = []
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") == []:
        continue
    for field in ("description", "license", "repository", "homepage", "documentation", "keywords", "categories"):
        if not p.get(field):
            missing.append(p["name"] + " has no `" + field + "`")
    print(p["name"], p["version"])
if missing:
    sys.exit("\n".join(missing))')
mapfile -t packages <<<"$listing"
selected=()
for entry in "${packages[@]}"; do selected+=(-p "${entry%% *}"); done
cargo package "${selected[@]}" --no-verify --allow-dirty --quiet

members=()
patches=()
for entry in "${packages[@]}"; do
    read -r name version <<<"$entry"
    crate=$target/package/$name-$version.crate
    [[ -f $crate ]] || { echo "cargo package made no $crate" >&2; exit 1; }
    tar -xzf "$crate" -C "$scratch"
    members+=("\"$name-$version\"")
    patches+=("$name = { path = \"$name-$version\" }")
done

{
    echo '[workspace]'
    echo 'resolver = "3"'
    echo "members = [$(IFS=,; echo "${members[*]}")]"
    echo
    echo '[patch.crates-io]'
    printf '%s\n' "${patches[@]}"
} >"$scratch/Cargo.toml"
cp Cargo.lock "$scratch/Cargo.lock"
# `cargo package` stamps every file with one fixed time in 2006, so against the kept
# target directory a changed crate would look older than its last check and be skipped:
# date the sources now, so that each run checks what it packed.
find "$scratch" -type f -exec touch {} +

for entry in "${packages[@]}"; do
    read -r name _ <<<"$entry"
    echo "checking $name from its package"
    CARGO_TARGET_DIR=$target/package-check/target \
        cargo check --quiet --manifest-path "$scratch/Cargo.toml" -p "$name"
done
echo "${#packages[@]} packages check from their packaged sources"
