#!/usr/bin/env bash
# The battery's recorded results (docs/reliability/cells.tsv, written by
# `scripts/battery.sh --record`): no row whose verdict is ok reports a lost or an
# unexpected message, and the tables generated from the file into the docs are what the
# file gives, so the docs cannot drift from the data. Ends by showing both checks can fail.
#
#   scripts/check-results.sh
set -euo pipefail
cd "$(dirname "$0")/.."

results=docs/reliability/cells.tsv
pages=(docs/RELIABILITY.md docs/reliability/cells.md)

# check_rows FILE: every row of FILE whose verdict is ok has lost = 0 and unexpected = 0;
# every verdict is ok or FAILED. Names each row at fault.
check_rows() {
    awk -F'\t' '
        NR == 1 {
            for (i = 1; i <= NF; i++) col[$i] = i
            if (!col["store"] || !col["sink"] || !col["fault"] || !col["lost"] || !col["unexpected"] || !col["verdict"]) {
                print FILENAME ": the header names no store, sink, fault, lost, unexpected or verdict column" > "/dev/stderr"
                bad = 1
                exit
            }
            next
        }
        {
            cell = FILENAME ":" NR ": " $col["store"] " × " $col["sink"] " × " $col["fault"]
            verdict = $col["verdict"]
        }
        verdict != "ok" && verdict != "FAILED" {
            print cell ": verdict \"" verdict "\" is neither ok nor FAILED" > "/dev/stderr"
            bad = 1
        }
        verdict == "ok" && ($col["lost"] != "0" || $col["unexpected"] != "0") {
            print cell ": lost = " $col["lost"] ", unexpected = " $col["unexpected"] ", yet its verdict is ok" > "/dev/stderr"
            bad = 1
        }
        END { exit bad }' "$1"
}

# check_pages FILE PAGES...: the generated tables in PAGES are what FILE gives.
check_pages() {
    cargo run --quiet -p outbox-battery -- table --check "$@"
}

check_rows "$results"
check_pages "$results" "${pages[@]}"
rows=$(($(wc -l <"$results") - 1))
failing=$(awk -F'\t' 'NR > 1 && $NF == "FAILED"' "$results" | wc -l)
echo "$results: $rows rows, none that passed with a loss; $failing failing; ${pages[*]} match it"

# The checks can fail: a passing row that lost a message, and a page that drifted.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
awk -F'\t' -v OFS='\t' '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; print; next }
    NR == 2 { $col["lost"] = 3; $col["verdict"] = "ok" }
    { print }' "$results" >"$scratch/lost.tsv"
if (check_rows "$scratch/lost.tsv") 2>/dev/null; then
    echo "check_rows passed a row that lost 3 messages with the verdict ok: the check is broken" >&2
    exit 1
fi
for page in "${pages[@]}"; do
    copy=$scratch/$(basename "$page")
    # A line added among the generated ones.
    sed '/<!-- battery:[a-z]*:begin/a edited by hand' "$page" >"$copy"
    if cmp -s "$page" "$copy"; then
        echo "$page has no generated lines to edit: the self-test cannot show the check failing" >&2
        exit 1
    fi
    if check_pages "$results" "$copy" 2>"$scratch/err"; then
        echo "check_pages passed a copy of $page with a line added to its generated tables: the check is broken" >&2
        exit 1
    fi
    if ! grep -q "its generated tables are not what" "$scratch/err"; then
        echo "check_pages refused the edited copy of $page for another reason:" >&2
        cat "$scratch/err" >&2
        exit 1
    fi
done
echo "the checks can fail: they refuse a passing row with lost = 3, and a copy of each page with an edited table"
