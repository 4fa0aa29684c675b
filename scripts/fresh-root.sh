#!/usr/bin/env bash
# Runs the README's first command, `cargo run --example quickstart`, as a new user would: in
# a minimal Debian root with a C compiler and nothing else, an empty cargo home, and the
# machine's Rust toolchain mounted read-only. Passes when the quickstart's last line ends in
# `lost=0`.
#
#   scripts/fresh-root.sh          the check (`scripts/test.sh` runs it on every CI run)
#   scripts/fresh-root.sh --cold   the same with an empty target directory: times a cold build
#
# The root comes from `debootstrap --variant=minbase` and is kept under
# ~/.cache/outbox-fresh-root, as is the quickstart's target directory. Nothing a run does
# stays in the root: the cargo home, /tmp and the copy of this checkout live on tmpfs in a
# mount namespace of the run's own. Needs root (debootstrap, chroot, mounts).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[fresh-root] %s\n' "$*" >&2; }
fail() { # step, log file
    log "FAILED: $1"
    if [[ -n ${2:-} && -s $2 ]]; then
        log "last lines of $2:"
        tail -n 40 "$2" >&2
    fi
    exit 1
}

cold=0
case ${1:-} in
--cold) cold=1 ;;
"") ;;
*) echo "usage: $0 [--cold]" >&2; exit 2 ;;
esac

[[ $(id -u) -eq 0 ]] || fail "needs root (debootstrap, chroot and mounts); run it as root"

cache=${OUTBOX_FRESH_ROOT_DIR:-$HOME/.cache/outbox-fresh-root}
root=$cache/bookworm
target=$cache/target
logs=$cache/logs
mkdir -p "$cache" "$target" "$logs"
# What a new machine of our kind has: a C toolchain, pkg-config and git, nothing else.
packages=ca-certificates,gcc,libc6-dev,make,pkg-config,git
mirror=${OUTBOX_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# 1. The root, once per machine: a stamp marks a finished debootstrap.
if [[ ! -f $root/.outbox-root-complete || $(cat "$root/.outbox-root-complete") != "$packages" ]]; then
    command -v debootstrap >/dev/null ||
        fail "needs debootstrap (Debian package debootstrap; scripts/services.sh installs it)"
    log "debootstrap bookworm (minbase + $packages) into $root (once per machine, ~2 min)"
    rm -rf "$root"
    timeout 15m debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" \
        >"$logs/debootstrap.log" 2>&1 || fail "debootstrap" "$logs/debootstrap.log"
    echo "$packages" >"$root/.outbox-root-complete"
fi

# 2. The toolchain: the machine's rustup home and cargo's binaries, read-only.
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=$(dirname "$(command -v cargo)")
toolchain=$(rustup show active-toolchain 2>/dev/null | cut -d' ' -f1) || true
[[ -n $toolchain ]] || fail "no active Rust toolchain (rustup show active-toolchain)"
ca_bundle=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
[[ -f $ca_bundle ]] || fail "no CA bundle at $ca_bundle (set SSL_CERT_FILE)"

# 3. This checkout as a new user would clone it: tracked and new files, no target directory.
source_tar=$cache/source.tar
while IFS= read -r -d '' file; do
    if [[ -e $file ]]; then printf '%s\0' "$file"; fi # a file deleted in the work tree stays out
done < <(git ls-files -z --cached --others --exclude-standard) |
    tar --null -T - -cf "$source_tar" || fail "pack the checkout"

if ((cold)); then
    log "cold: emptying the target directory $target"
    rm -rf "$target"
    mkdir -p "$target"
fi

# 4. The run, in a mount namespace of its own: every mount below vanishes with it.
run_log=$logs/quickstart.log
log "running \`cargo run --example quickstart\` in the root (output: $run_log)"
started=$SECONDS
status=0
timeout --kill-after=30s 30m unshare --mount --propagation private bash -euo pipefail -c '
    root=$1 rustup_home=$2 cargo_bin=$3 target=$4 source_tar=$5 ca_bundle=$6 toolchain=$7
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    for dir in tmp root; do mount -t tmpfs -o size=4g tmpfs "$root/$dir"; done
    mkdir -p "$root/opt/rustup" "$root/opt/cargo-bin" "$root/var/cache/quickstart-target"
    mount --bind -o ro "$rustup_home" "$root/opt/rustup"
    mount --bind -o ro "$cargo_bin" "$root/opt/cargo-bin"
    mount --bind "$target" "$root/var/cache/quickstart-target"
    mount --bind -o ro "$ca_bundle" "$root/etc/ssl/certs/ca-certificates.crt"
    mount --bind -o ro /etc/resolv.conf "$root/etc/resolv.conf"
    mkdir "$root/root/outbox"
    tar -xf "$source_tar" -C "$root/root/outbox"
    exec chroot "$root" /usr/bin/env -i HOME=/root USER=root LANG=C.UTF-8 \
        PATH=/opt/cargo-bin:/usr/local/bin:/usr/bin:/bin \
        RUSTUP_HOME=/opt/rustup RUSTUP_TOOLCHAIN="$toolchain" CARGO_HOME=/root/.cargo \
        CARGO_TARGET_DIR=/var/cache/quickstart-target CARGO_TERM_COLOR=never \
        bash -c "cd /root/outbox && cargo run --example quickstart"
' fresh-root "$root" "$rustup_home" "$cargo_bin" "$target" "$source_tar" "$ca_bundle" "$toolchain" \
    >"$run_log" 2>&1 || status=$?
seconds=$((SECONDS - started))

if ((status != 0)); then
    fail "cargo run --example quickstart (exit $status after ${seconds}s)" "$run_log"
fi
last=$(grep -v '^\s*$' "$run_log" | tail -n 1)
if [[ $last != *" lost=0" ]]; then
    fail "the quickstart's last line does not end in lost=0: $last" "$run_log"
fi
log "passed in ${seconds}s ($( ((cold)) && echo cold || echo "target kept in $target")): $last"
