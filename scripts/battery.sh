#!/usr/bin/env bash
# The reliability battery: every store × sink × fault cell, then the deliberately broken
# relay, which the battery must catch losing messages. Prints one line per cell and a
# Markdown table of the counts (docs/RELIABILITY.md explains them).
#
#   scripts/battery.sh                 the whole table (hours: run it on demand)
#   scripts/battery.sh --quick         the CI slice: a few cells with fewer cycles
#   STORES="postgres" SINKS="http redis" FAULTS="kill9 db-restart" CYCLES=20 scripts/battery.sh
#   CELLS="mysql sqs kill9
#          diesel-sqlite kafka kill3" scripts/battery.sh     exactly these cells, one per line
#   scripts/battery.sh --record        (or RECORD=1) also records each cell's result
#
# With --record, each cell's result replaces its row in docs/reliability/cells.tsv (the
# latest run wins; the commit is `git rev-parse --short HEAD`, with `-dirty` when files
# outside docs/ differ from it), and the run ends by regenerating the tables in
# docs/reliability/cells.md and docs/RELIABILITY.md from that file. Without it, nothing
# under docs/ changes.
#
# Starts the services it needs (scripts/services.sh), builds `outbox` and `outbox-battery`,
# and bounds every cell with a time limit. Exits 1 if any cell broke a promise or the
# broken relay went unnoticed.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
record=0
[[ ${RECORD:-0} == 1 ]] && record=1
for arg in "$@"; do
    case $arg in
    --quick) quick=1 ;;
    --record) record=1 ;;
    *)
        echo "usage: scripts/battery.sh [--quick] [--record]" >&2
        exit 2
        ;;
    esac
done
results=docs/reliability/cells.tsv
pages=(docs/RELIABILITY.md docs/reliability/cells.md)

if ((quick)); then
    cells=(
        "postgres http kill9"
        "sqlite redis kill3"
        "mysql http receiver-5xx"
        "postgres redis db-kill"
        "postgres kafka clock-skew"
        "diesel-postgres redis sink-restart"
        "postgres nats sink-restart"
        "sqlite mqtt sink-restart"
    )
    cycles=${CYCLES:-5}
elif [[ -n ${CELLS:-} ]]; then
    mapfile -t cells < <(sed 's/^[[:space:]]*//; /^$/d' <<<"$CELLS")
    cycles=${CYCLES:-20}
else
    cells=()
    for store in ${STORES:-postgres sqlite mysql diesel-postgres diesel-sqlite diesel-mysql}; do
        for sink in ${SINKS:-http redis amqp kafka sqs nats mqtt}; do
            for fault in ${FAULTS:-none kill9 kill3 sigstop db-restart db-kill net-sink net-store silent-sink silent-store clock-skew sink-restart receiver-5xx receiver-slow}; do
                cells+=("$store $sink $fault")
            done
        done
    done
    cycles=${CYCLES:-20}
fi

if [[ -z ${OUTBOX_BATTERY_NO_SERVICES:-} ]]; then
    services=$(mktemp)
    bash scripts/services.sh >"$services" || exit 1
    while IFS='=' read -r name value; do
        if [[ -z ${!name:-} ]]; then export "$name=$value"; fi
    done <"$services"
    rm -f "$services"
fi

# The relays are `outbox relay`; its default features open the `diesel+` URLs of the diesel
# cells on the relay store of the same database.
cargo build --quiet -p outbox-cli -p outbox-battery || exit 1
target=${CARGO_TARGET_DIR:-target}
battery="$target/debug/outbox-battery"
export OUTBOX_CLI="$target/debug/outbox"

if ((record)); then
    # The code the cells run is the tree as built now; the results this run writes under
    # docs/ do not make it dirty.
    commit=$(git rev-parse --short HEAD) || exit 1
    if [[ -n $(git status --porcelain -- . ':(exclude)docs') ]]; then commit+=-dirty; fi
    echo "recording the results in $results, at commit $commit"
fi

failed=0
rows=()
# run-cell STORE SINK FAULT [ARGS...]: prints the cell's line; returns the battery's status.
run_cell() {
    local store=$1 sink=$2 fault=$3 line status
    shift 3
    line=$(timeout --kill-after=10s 15m "$battery" run --store "$store" --sink "$sink" \
        --fault "$fault" --cycles "$cycles" "$@" 2>"$log")
    status=$?
    echo "${line:-battery store=$store sink=$sink fault=$fault: no result (exit $status)}"
    if ((status != 0 && status != 2)); then tail -n 20 "$log" >&2; fi
    last_line=$line
    return "$status"
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$last_line"; }

for cell in "${cells[@]}"; do
    read -r store sink fault <<<"$cell"
    run_cell "$store" "$sink" "$fault"
    case $? in
    0) verdict=ok ;;
    2) continue ;; # not applicable (e.g. a database restart on SQLite)
    *) verdict=FAILED; failed=1 ;;
    esac
    rows+=("| $store | $sink | $fault | $(field faults) | $(field committed) | $(field rolled_back) | $(field lost) | $(field unexpected) | $(field duplicates) | $(field leased_at_kills) | $(field out_of_order) | $(field unfinished) | $(field seconds) | $verdict |")
    if ((record)); then
        # A cell that printed no line is recorded as failed, with unknown counts.
        "$battery" record "$results" --commit "$commit" --verdict "$verdict" \
            "${last_line:-battery store=$store sink=$sink fault=$fault}" || failed=1
    fi
done

# The battery can fail: a relay that marks before it publishes must show lost > 0.
run_cell postgres http kill9 --broken
lost=$(field lost)
if [[ ${lost:-0} -gt 0 ]]; then
    echo "broken relay caught: lost=$lost"
else
    echo "the broken relay lost nothing the battery could see: the battery is blind" >&2
    failed=1
fi

printf '\n| store | sink | fault | faults | committed | rolled back | lost | unexpected | duplicates | leased at kills | out of order | unfinished | seconds | verdict |\n'
printf '|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n'
printf '%s\n' "${rows[@]}"
if ((record)); then
    "$battery" table "$results" "${pages[@]}" || failed=1
    echo "recorded: $results, ${pages[*]}"
fi
exit "$failed"
