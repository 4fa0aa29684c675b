#!/usr/bin/env bash
# Builds the release `outbox` binary (crate outbox-cli), copies it into OUT_DIR and prints
# its version. The container image's build stage (deploy/Dockerfile) runs exactly this; it
# runs as well on any Debian machine with Rust, a C compiler and make.
#
#   deploy/build-release.sh [OUT_DIR]       OUT_DIR defaults to dist/ (relative to the
#                                           current directory)
#
#   CARGO_TARGET_DIR   where cargo builds (default: target/ in the repository)
#   CLI_FEATURES       the CLI's Cargo features, comma-separated, instead of its defaults
#                      (every store and sink), e.g. postgres,http,tls; at least one store
#
# Debian packages for the build: build-essential (librdkafka, SQLite, aws-lc and ring are
# compiled from C), pkg-config and zlib1g-dev (optional: without them librdkafka gets a
# bundled zlib).
set -euo pipefail

fail() {
    printf 'build-release: %s\n' "$*" >&2
    exit 1
}

out=${1:-dist}
mkdir -p "$out" || fail "cannot create the output directory $out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

command -v cargo >/dev/null || fail "cargo is missing: install Rust (https://rustup.rs)"
command -v cc >/dev/null || fail "no C compiler (cc): apt-get install build-essential"
features=${CLI_FEATURES:-}
if [[ -z $features || ,$features, == *,kafka,* ]]; then
    # librdkafka builds with its own configure script and make.
    command -v make >/dev/null || fail "make is missing (the kafka feature needs it): apt-get install build-essential"
fi

args=(build --release --locked -p outbox-cli)
if [[ -n $features ]]; then
    args+=(--no-default-features --features "$features")
fi
echo "build-release: cargo ${args[*]}" >&2
cargo "${args[@]}" || fail "cargo build failed"

# Where cargo put the binary: cargo metadata knows the target directory, whether it comes
# from CARGO_TARGET_DIR, a cargo config file or the default.
target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[[ -n $target_dir ]] || fail "cargo metadata did not give the target directory"
binary=$target_dir/${CARGO_BUILD_TARGET:+$CARGO_BUILD_TARGET/}release/outbox
[[ -x $binary ]] || fail "the build left no executable at $binary"

install -m 0755 "$binary" "$out/outbox"
echo "build-release: $out/outbox" >&2
"$out/outbox" --version || fail "$out/outbox --version failed"
