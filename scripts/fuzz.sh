#!/usr/bin/env bash
# Fuzzes the parsers that read outside input (the targets in fuzz/fuzz_targets) with
# cargo-fuzz, each for SECONDS (default 600), and prints a Markdown table of runs and
# crashes. On demand, not in CI: it needs the nightly toolchain and takes a while.
#
#   scripts/fuzz.sh              every target, 10 minutes each, two at a time
#   scripts/fuzz.sh 60 config    one target for a minute
#
# Installs cargo-fuzz and the nightly toolchain if missing. The corpus grows in
# fuzz/corpus/<target> (not committed; the seeds in fuzz/seeds are). A crash leaves its
# input in fuzz/artifacts/<target> and makes the script exit 1.
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-600}
shift || true
jobs=${FUZZ_JOBS:-2}
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-$HOME/.cache/outbox-fuzz-target}

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

targets=("$@")
((${#targets[@]})) || mapfile -t targets < <(cargo +nightly fuzz list)
# Safe Rust: the targets look for panics and broken properties, which need no sanitizer.
cargo +nightly fuzz build --sanitizer none || exit 1

mkdir -p logs
run() {
    local t=$1
    mkdir -p "corpus/$t" "seeds/$t"
    cargo +nightly fuzz run --sanitizer none "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 -max_len=4096 >"logs/$t.log" 2>&1
    echo $? >"logs/$t.rc"
}
for t in "${targets[@]}"; do
    run "$t" &
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
done
wait

failed=0
echo "| target | seconds | runs | runs/s | corpus | crashes |"
echo "|---|---:|---:|---:|---:|---:|"
for t in "${targets[@]}"; do
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "logs/$t.log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "logs/$t.log" | tail -1)
    corpus=$(find "corpus/$t" -type f | wc -l)
    crashes=0
    if [[ $(cat "logs/$t.rc") != 0 ]]; then
        crashes=1
        failed=1
        echo "[fuzz] $t failed; see fuzz/logs/$t.log and fuzz/artifacts/$t" >&2
    fi
    echo "| $t | $seconds | ${runs:-?} | ${rate:-?} | $corpus | $crashes |"
done
exit $failed
