#!/usr/bin/env bash
# Checks the test harness itself: a test that fails, or hangs, while a child process it
# started is running must end with that child gone and a red closing line, within seconds.
# Runs `scripts/test.sh` on the harness self-test (test-support/tests/harness.rs) in its
# deliberate `panic` and `hang` modes.
set -euo pipefail
cd "$(dirname "$0")/.."

test_name=a_spawned_child_ends_with_its_test
for mode in panic hang; do
    pidfile=$(mktemp)
    log=$(mktemp)
    started=$SECONDS
    status=0
    OUTBOX_HARNESS_SELFTEST=$mode OUTBOX_HARNESS_PIDFILE=$pidfile \
        scripts/test.sh -p outbox-test-support -E "test(=$test_name)" >"$log" 2>&1 </dev/null || status=$?
    took=$((SECONDS - started))
    pid=$(cat "$pidfile")
    last=$(tail -n 1 "$log")
    problems=()
    ((status != 0)) || problems+=("the run exited 0")
    [[ $last == "0 passed, 1 failed" ]] || problems+=("closing line is '$last'")
    grep -q "^  outbox-test-support::harness $test_name\$" "$log" || problems+=("the failed test is not listed")
    [[ -n $pid ]] || problems+=("the test wrote no child pid")
    # A killed child whose parent died too stays a zombie until init reaps it: dead.
    if [[ -n $pid ]] && [[ $(ps -o stat= -p "$pid" 2>/dev/null) =~ ^[^Z] ]]; then
        problems+=("child $pid is still running")
        kill -KILL "$pid" 2>/dev/null || true
    fi
    ((took <= 60)) || problems+=("took ${took}s")
    if ((${#problems[@]})); then
        echo "harness self-check ($mode) FAILED: ${problems[*]}" >&2
        sed 's/^/    | /' "$log" >&2
        exit 1
    fi
    echo "harness self-check ($mode): red in ${took}s (\"$last\"), child $pid gone"
    rm -f "$pidfile" "$log"
done
