#!/usr/bin/env bash
# Checks the deployment files of docs/DEPLOYMENT.md without Docker and without a running
# systemd:
#
#   1. deploy/outbox-relay.service passes `systemd-analyze verify` with no warning about it,
#      and `systemd-analyze security` rates its exposure 2.0 or lower;
#   2. every path deploy/Dockerfile copies from the build context exists, every workspace
#      member is among them, and its build stage runs deploy/build-release.sh;
#   3. deploy/build-release.sh builds the release binary into a scratch directory, and the
#      binary answers `--version` and `relay --help`.
#
#   scripts/check-deploy.sh              all three
#   scripts/check-deploy.sh --no-build   1 and 2 only (seconds, no cargo)
#
# systemd-analyze comes from the Debian package systemd, installed here when it is missing
# (as root, or with sudo), as scripts/services.sh does. It does not need systemd running.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
case ${1:-} in
--no-build) build=0 ;;
"") ;;
*) echo "usage: $0 [--no-build]" >&2; exit 2 ;;
esac

log() { printf '[check-deploy] %s\n' "$*" >&2; }
fail() {
    log "FAILED: $*"
    exit 1
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

unit=deploy/outbox-relay.service
dockerfile=deploy/Dockerfile
builder=deploy/build-release.sh
for file in "$unit" "$dockerfile" "$builder"; do
    [[ -f $file ]] || fail "$file is missing"
done

# 1. The systemd unit.
if ! command -v systemd-analyze >/dev/null; then
    if [[ $(id -u) -ne 0 ]] && ! sudo -n true 2>/dev/null; then
        fail "systemd-analyze is missing, and neither root nor sudo to install it: sudo apt-get install systemd"
    fi
    log "installing the Debian package systemd (for systemd-analyze)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null ||
        fail "could not install systemd: sudo apt-get install systemd"
    command -v systemd-analyze >/dev/null ||
        fail "the package systemd is installed, but systemd-analyze is not on PATH ($PATH)"
fi

# verify refuses a unit whose ExecStart binary does not exist. Unless the binary is
# installed here, a copy is verified whose ExecStart names a stub `outbox` in the scratch
# directory, with the same arguments: only the directory of the binary differs, so every
# other line is checked as written.
exec_path=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[[ $exec_path == /usr/local/bin/outbox ]] ||
    fail "$unit: ExecStart runs ${exec_path:-nothing}, not /usr/local/bin/outbox"
checked=$unit
if [[ ! -x $exec_path ]]; then
    mkdir -p "$scratch/bin" "$scratch/unit"
    printf '#!/bin/sh\nexit 0\n' >"$scratch/bin/outbox"
    chmod 0755 "$scratch/bin/outbox"
    checked=$scratch/unit/outbox-relay.service
    sed -E "s|^(ExecStart(Pre)?=)$exec_path |\1$scratch/bin/outbox |" "$unit" >"$checked"
    log "$exec_path is not installed here: verifying a copy of $unit that runs a stub"
fi
# verify exits 0 after warnings (an unknown key, a value it cannot parse, which it then
# ignores), so any line about the unit fails the check too.
verify_status=0
systemd-analyze verify --man=no "$checked" >"$scratch/verify.log" 2>&1 || verify_status=$?
if ((verify_status)) || grep -q 'outbox-relay\.service' "$scratch/verify.log"; then
    cat "$scratch/verify.log" >&2
    fail "systemd-analyze verify $unit (exit status $verify_status, output above)"
fi
if [[ -s $scratch/verify.log ]]; then
    log "systemd-analyze verify said, about other units:"
    cat "$scratch/verify.log" >&2
fi
log "systemd-analyze verify $unit: ok"
# The threshold is on a 0-100 scale: 20 is an exposure level of 2.0.
if ! systemd-analyze security --offline=yes --threshold=20 --no-pager "$checked" \
    >"$scratch/security.log" 2>&1; then
    cat "$scratch/security.log" >&2
    fail "systemd-analyze security: $unit is exposed above 2.0 (its hardening lines were weakened?)"
fi
log "systemd-analyze security $unit: $(sed -n 's/^→ Overall exposure level for [^:]*: //p' "$scratch/security.log")"

# 2. The Dockerfile. Lines continued with a backslash are joined first.
joined=$scratch/Dockerfile.joined
sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' "$dockerfile" >"$joined"
sources=()
while read -r instruction rest; do
    [[ ${instruction^^} == COPY || ${instruction^^} == ADD ]] || continue
    read -ra words <<<"$rest"
    paths=()
    from_stage=0
    for word in "${words[@]}"; do
        case $word in
        --from=*) from_stage=1 ;;
        --*) ;;
        *) paths+=("$word") ;;
        esac
    done
    ((from_stage)) && continue
    [[ ${paths[0]:-} != '['* ]] || fail "$dockerfile: write COPY in shell form, not JSON form: $instruction $rest"
    ((${#paths[@]} >= 2)) || fail "$dockerfile: a COPY without source and destination: $instruction $rest"
    unset 'paths[-1]'
    sources+=("${paths[@]}")
done <"$joined"
((${#sources[@]})) || fail "$dockerfile copies nothing from the build context"
for source in "${sources[@]}"; do
    [[ -e $source ]] || fail "$dockerfile copies $source, which is not in the repository"
done
# Cargo reads every member of the workspace, so each must be copied.
members=$(sed -n 's/^members *= *\[\(.*\)\]/\1/p' Cargo.toml | tr -d '" ' | tr ',' '\n')
[[ -n $members ]] || fail "cannot read the workspace members from Cargo.toml"
copied=$(printf '%s\n' "${sources[@]}")
for member in $members Cargo.toml Cargo.lock README.md "$builder"; do
    grep -qxF "$member" <<<"$copied" ||
        fail "$dockerfile does not copy $member (the release build needs it)"
done
# The build stage (first FROM up to the second) runs the build script, and the runtime
# stage starts the CLI.
build_stage=$(awk 'toupper($1) == "FROM" { n++ } n == 1' "$joined")
grep -Eq "^RUN .*(bash )?$builder( |$)" <<<"$build_stage" ||
    fail "$dockerfile: the build stage does not RUN $builder"
grep -qx 'ENTRYPOINT \["outbox"\]' "$joined" || fail "$dockerfile: ENTRYPOINT is not [\"outbox\"]"
log "$dockerfile: ${#sources[@]} paths copied, all present; the build stage runs $builder"

# 3. The build step, outside Docker.
if ((build == 0)); then
    log "skipping the release build (--no-build)"
    exit 0
fi
bash -n "$builder" || fail "$builder does not parse"
log "running $builder (a release build: minutes on a cold target directory)"
bash "$builder" "$scratch/dist" || fail "$builder failed"
binary=$scratch/dist/outbox
[[ -x $binary ]] || fail "$builder left no executable at $binary"
version=$("$binary" --version) || fail "$binary --version failed"
[[ $version == outbox\ * ]] || fail "$binary --version printed '$version', not 'outbox VERSION'"
"$binary" relay --help >"$scratch/relay-help.txt" 2>&1 || {
    cat "$scratch/relay-help.txt" >&2
    fail "$binary relay --help failed"
}
grep -q -- '--config' "$scratch/relay-help.txt" || fail "$binary relay --help does not mention --config"
log "built $version; relay --help answers"
log "all checks passed"
