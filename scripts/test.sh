#!/usr/bin/env bash
# The project's one test command. CI (.ci/run) runs it with no arguments.
#
#   scripts/test.sh                  everything: services, rustfmt, clippy, docs, architecture
#                                    invariants, the harness self-check, every test and doctest,
#                                    and a slice of the reliability battery
#   scripts/test.sh ARGS...          services, then only the tests that `cargo nextest run`
#                                    selects with ARGS, e.g. `-p outbox-cli` or `-E 'test(swap)'`
#
# Tests run under cargo-nextest (installed here if missing) with the limits in
# .config/nextest.toml: each test in its own process, killed with every process it started
# when it outlives its time limit. Every step runs even when an earlier one failed; the run
# ends with the time each step took, the failed tests and steps, and one closing line
# `N passed, N failed`.
set -uo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
failures=()
failed_steps=()
timings=()

step_started=$SECONDS
step_name=
step() {
    end_step
    step_name=$1
    step_started=$SECONDS
    printf '\n==> %s\n' "$step_name"
}
end_step() {
    if [[ -n $step_name ]]; then
        timings+=("$(printf '%5ss  %s' "$((SECONDS - step_started))" "$step_name")")
    fi
    step_name=
}
# Runs a command of the current step; a failure is recorded and the run goes on.
check() {
    if ! "$@"; then
        failed_steps+=("$step_name")
    fi
}

# Runs a command with its output in a log file that is shown as it grows. The script waits
# for the command only, never for a pipe: a process the command leaves behind holding its
# stdout cannot keep this script waiting. `limit` bounds the whole command.
logged() { # log-file limit command...
    local log=$1 limit=$2
    shift 2
    : >"$log" # before tail opens it: the background job may not have created it yet
    timeout --kill-after=30s "$limit" "$@" >"$log" 2>&1 </dev/null &
    local pid=$!
    tail -n +1 -f --pid="$pid" "$log"
    wait "$pid"
}

# Adds a nextest run's JUnit report to the totals and the list of failed tests.
count_junit() { # junit.xml
    local junit=$1 counts
    [[ -f $junit ]] || return 0
    counts=$(awk '
        /<testcase / { cases++; match($0, /name="[^"]*"/); name = substr($0, RSTART + 6, RLENGTH - 7)
                       match($0, /classname="[^"]*"/); class = substr($0, RSTART + 11, RLENGTH - 12) }
        /<(failure|error)[ >\/]/ { bad++; print "FAILED " class " " name }
        /<skipped/ { skipped++ }
        END { print "COUNTS " cases - bad - skipped " " bad }' "$junit")
    while read -r kind rest; do
        case $kind in
        FAILED) failures+=("$rest") ;;
        COUNTS)
            read -r p f <<<"$rest"
            passed=$((passed + p))
            failed=$((failed + f))
            ;;
        esac
    done <<<"$counts"
}

# Runs `cargo nextest run` with the CI profile and counts its results.
nextest() { # limit args...
    local limit=$1
    shift
    local junit=target/nextest/ci/junit.xml
    rm -f "$junit"
    check logged "$work/nextest.log" "$limit" cargo nextest run --profile ci --no-fail-fast "$@"
    count_junit "$junit"
}

# Runs the doctests and counts their results from libtest's lines.
doctests() {
    check logged "$work/doc.log" 20m cargo test --workspace --all-features --doc --no-fail-fast
    local p f
    read -r p f < <(awk '/^test result:/ { for (i = 2; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
                         END { print p + 0, f + 0 }' "$work/doc.log")
    passed=$((passed + p))
    failed=$((failed + f))
    while read -r name; do
        failures+=("doctest $name")
    done < <(sed -n 's/^test \(.*\) \.\.\. FAILED$/\1/p' "$work/doc.log")
}

summary() {
    end_step
    printf '\n==> where the time went\n'
    printf '%s\n' "${timings[@]}"
    printf '%5ss  total\n' "$SECONDS"
    if ((${#failures[@]})); then
        printf '\nfailed tests:\n'
        printf '  %s\n' "${failures[@]}"
    fi
    if ((${#failed_steps[@]})); then
        printf '\nfailed steps:\n'
        printf '  %s\n' "${failed_steps[@]}"
    fi
    printf '\n%d passed, %d failed\n' "$passed" "$failed"
    if ((${#failed_steps[@]} || failed)); then exit 1; fi
    exit 0
}

# Start (or install) the servers the tests need; keep URLs the caller already exported.
services() {
    if ! bash scripts/services.sh >"$work/services.env"; then
        failed_steps+=("$step_name")
        summary
    fi
    while IFS='=' read -r name value; do
        if [[ -z ${!name:-} ]]; then export "$name=$value"; fi
        echo "$name=${!name}"
    done <"$work/services.env"
}

step "services"
if (($#)); then
    services
else
    # The full run builds the Kafka broker (tansu, once per machine) in the background
    # while the lints and builds run; the step "kafka broker" waits for it.
    OUTBOX_SERVICES_KAFKA=background services
fi

step "cargo-nextest"
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "installing cargo-nextest (once per machine)"
    check cargo install cargo-nextest --locked
fi
cargo nextest --version | head -1

if (($#)); then
    step "tests: $*"
    nextest 60m --all-features "$@"
    summary
fi

step "rustfmt"
check cargo fmt --all -- --check

step "clippy (warnings denied)"
check cargo clippy --workspace --all-targets --all-features -- -D warnings

step "docs (broken links denied)"
check env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet
# The README shows the Debian packages scripts/services.sh installs, as one command.
readme_packages() {
    local install
    install="apt-get install $(bash scripts/services.sh --packages)"
    grep -qF "$install" README.md || { echo "README.md must show \`$install\`" >&2; return 1; }
}
check readme_packages

step "architecture invariants (and every name ARCHITECTURE.md gives exists)"
check scripts/check-architecture.sh

step "battery results (no passing row with a loss; the docs' tables match docs/reliability/cells.tsv)"
check scripts/check-results.sh

step "publishable (every library crate packages and compiles from its package)"
check scripts/check-packages.sh

step "outside users (tests/outside: each builds alone, with only what the README names)"
check scripts/check-outside.sh

step "the README's first command on a bare machine (scripts/fresh-root.sh)"
check scripts/fresh-root.sh

step "harness self-check (a failing or hanging test ends with its children, red)"
check scripts/check-harness.sh

step "deployment files (the systemd unit verified, the container's build script run)"
check scripts/check-deploy.sh

step "build tests"
check cargo test --workspace --all-features --no-run --quiet
# The examples' tests run the `outbox` binary this build made.
target_dir=${CARGO_TARGET_DIR:-target}
[[ $target_dir == /* ]] || target_dir=$PWD/$target_dir
export OUTBOX_CLI=$target_dir/debug/outbox

step "kafka broker (waits for its build in the background)"
services

step "feature gating (front crate without the redis feature)"
nextest 10m -p outbox --features http --test readme_config

step "tests"
nextest 60m --workspace --all-features

step "doctests"
doctests

step "reliability battery (CI slice; scripts/battery.sh runs the whole table)"
check logged "$work/battery.log" 25m env OUTBOX_BATTERY_NO_SERVICES=1 bash scripts/battery.sh --quick

summary
