#!/usr/bin/env bash
# Architecture checks.
#
# 1. Names: every path, HTTP route, CLI command, package, type, Rust path, macro,
#    constant and snake_case name that ARCHITECTURE.md puts in backticks exists in the
#    repository (one pass over the
#    sources with awk, no cargo). A self-test shows the check fails on a bogus name and on
#    a type renamed in a scratch copy of the sources.
# 2. Invariants: the core, the webhook receiver and the dashboard depend on no database,
#    broker or HTTP client, so a service that only receives compiles none of them, and the
#    dashboard works over any store; the quickstart builds none of them either.
#
#   scripts/check-architecture.sh           both
#   scripts/check-architecture.sh --names   the names check and its self-test only
set -euo pipefail
cd "$(dirname "$0")/.."

# ---------------------------------------------------------------------------------------
# 1. Names
# ---------------------------------------------------------------------------------------

# Backticked spans that are shaped like a code name but are not one. Keep it short: most
# commands, SQL and configuration keys are not name-shaped (spaces, dots, brackets) and
# are skipped without being listed here.
allowed=(
    # SQL keywords, shaped like constants.
    INSERT UPDATE DELETE TRUNCATE NOTIFY LISTEN
)

# The files the work tree holds (tracked, or new and not ignored), one path per line.
repo_files() {
    comm -23 <(git ls-files --cached --others --exclude-standard | sort -u) \
        <(git ls-files --deleted | sort -u)
}

# Folders that hold a Cargo.toml: a path may be given relative to one of them.
crate_dirs() {
    repo_files | grep -E '(^|/)Cargo\.toml$' | sed -n 's|/Cargo\.toml$||p'
}

# Package names (as written and with `_` for `-`): the first segments of Rust paths.
package_names() {
    repo_files | grep -E '(^|/)Cargo\.toml$' | while read -r manifest; do
        awk '/^\[package\]/ {p = 1; next} /^\[/ {p = 0} p && /^name *=/ {gsub(/[" ]/, ""); sub(/^name=/, ""); print; exit}' "$manifest"
    done | awk '{print; gsub(/-/, "_"); print}' | sort -u
}

# The CLI's subcommands, from the variants of its `Subcommand` enums.
cli_commands() {
    awk '/derive\(.*Subcommand/ {s = 1} s && /^}/ {s = 0}
         s && match($0, /^    [A-Z][A-Za-z]*/) {print tolower(substr($0, 5, RLENGTH - 4))}' \
        outbox-cli/src/main.rs | sort -u
}

# index ROOT...: reads NUL-separated .rs and .sql paths on stdin and prints, one per line,
# `name NAME` for every item a Rust file defines (struct, enum, union, trait, type, fn,
# mod, const, static, macro_rules!, a pub field, an enum variant, a name a `pub use`
# brings in), `word WORD` for every identifier in code lines, and `route /PATH` for every
# string literal that is an HTTP path. Comment lines define nothing.
index() {
    xargs -0 awk '
        function ident_after(s,    n) {
            n = s
            sub(/^.*[^A-Za-z0-9_]/, "", n)
            return n
        }
        function all_idents(s, kind) {
            while (match(s, /[A-Za-z_][A-Za-z0-9_]*/)) {
                print kind " " substr(s, RSTART, RLENGTH)
                s = substr(s, RSTART + RLENGTH)
            }
        }
        FNR == 1 { in_use = 0; sql = FILENAME ~ /\.sql$/ }
        {
            line = $0
            if (line ~ /^[ \t]*(\/\/|--|\*|\/\*)/) next
            all_idents(line, "word")
            if (sql) next
            s = line
            while (match(s, /"\/[A-Za-z0-9_\/-]*"/)) {
                print "route " substr(s, RSTART + 1, RLENGTH - 2)
                s = substr(s, RSTART + RLENGTH)
            }
            s = " " line
            while (match(s, /[^A-Za-z0-9_](struct|enum|union|trait|type|fn|mod|const|static)[ \t]+[A-Za-z_][A-Za-z0-9_]*/)) {
                print "name " ident_after(substr(s, RSTART, RLENGTH))
                s = substr(s, RSTART + RLENGTH)
            }
            if (match(line, /macro_rules![ \t]*[A-Za-z_][A-Za-z0-9_]*/))
                print "name " ident_after(substr(line, RSTART, RLENGTH))
            if (line ~ /^[ \t]*pub(\([a-z]+\))?[ \t]+use[ \t]/) {
                rest = line
                sub(/^[ \t]*pub(\([a-z]+\))?[ \t]+use[ \t]+/, "", rest)
                all_idents(rest, "name")
                in_use = line !~ /;/
            } else if (in_use) {
                all_idents(line, "name")
                if (line ~ /;/) in_use = 0
            }
            if (match(line, /^[ \t]*pub(\([a-z]+\))?[ \t]+[a-z_][a-z0-9_]*[ \t]*:/)) {
                f = substr(line, RSTART, RLENGTH)
                sub(/[ \t]*:$/, "", f)
                print "name " ident_after(f)
            }
            if (match(line, /^[ \t]+[A-Z][A-Za-z0-9_]*[ \t]*([,({=]|$)/)) {
                v = substr(line, RSTART, RLENGTH)
                sub(/^[ \t]+/, "", v)
                sub(/[^A-Za-z0-9_].*$/, "", v)
                print "name " v
            }
        }' | sort -u
}

# spans FILE: every backticked span outside fenced code blocks, one per line; a span
# broken over two lines is joined with a space.
spans() {
    awk '/^[ \t]*```/ {fence = !fence; next}
         !fence {text = text " " $0}
         END {
             while (match(text, /`[^`]+`/)) {
                 print substr(text, RSTART + 1, RLENGTH - 2)
                 text = substr(text, RSTART + RLENGTH)
             }
         }' "$1"
}

# check_names DOC INDEX: checks every name-shaped span of DOC against INDEX (the output of
# `index`) and the repository's files; prints what it checked, names each missing one on
# stderr, and fails if any is missing.
check_names() {
    local doc=$1 index_file=$2 work
    work=$(mktemp -d)
    repo_files >"$work/files"
    crate_dirs >"$work/crates"
    package_names >"$work/packages"
    cli_commands >"$work/commands"
    printf '%s\n' "${allowed[@]}" >"$work/allowed"
    spans "$doc" >"$work/spans"
    awk -v report="$work/report" '
        function esc(s) {
            gsub(/[][\\.+?(){}^$|]/, "\\\\&", s)
            return s
        }
        # The path as a regular expression over repository paths: relative to the root,
        # to a crate folder, or to its src/; `*` and `<placeholder>` match one segment.
        function path_found(t,    re, i, end) {
            # A folder (a trailing `/`) holds a file; a file is one.
            end = sub(/\/$/, "", t) ? "/" : "$"
            re = esc(t)
            gsub(/\*/, "[^/]*", re)
            gsub(/<[^>]*>/, "[^/]+", re)
            if (t !~ /\//) re = "(^|/)" re end
            else re = "^(" crates ")?(src/)?" re end
            for (i = 1; i <= nfiles; i++) if (files[i] ~ re) return 1
            return 0
        }
        function checked(kind, t, ok) {
            if (!((kind, t) in seen)) {
                seen[kind, t] = 1
                list[kind] = list[kind] " " t
                count[kind]++
            }
            if (!ok) missing[kind ": " t] = 1
        }
        part == "files" { files[++nfiles] = $0; next }
        part == "crates" { crates = crates esc($0) "/|"; next }
        part == "packages" { packages[$0] = 1; next }
        part == "commands" { commands[$0] = 1; next }
        part == "allowed" { allowed[$0] = 1; next }
        part == "index" {
            if ($1 == "name") names[$2] = 1
            else if ($1 == "word") words[$2] = 1
            else if ($1 == "route") routes[$2] = 1
            next
        }
        part == "spans" {
            t = $0
            if (t in allowed) { checked("allowed", t, 1); next }
            # A command of the CLI: each word after `outbox` is a subcommand.
            if (t ~ /^outbox [a-z]/) {
                n = split(t, w, " ")
                ok = 1
                for (i = 2; i <= n && w[i] ~ /^[a-z][a-z-]*$/; i++) if (!(w[i] in commands)) ok = 0
                checked("commands", t, ok)
                next
            }
            if (t ~ /[ \t]/) { skipped++; next }
            # An HTTP route the code serves.
            if (t ~ /^\/[A-Za-z0-9_\/-]+$/) { checked("routes", t, t in routes); next }
            if (t ~ /:\/\//) { skipped++; next }
            # A file or folder.
            if (t ~ /\// || t ~ /\.(rs|sh|toml|md|sql|c|svg|png|yml|yaml|json)$/) {
                checked("paths", t, path_found(t))
                next
            }
            # A package, by its name or its folder.
            if (t ~ /^(outbox|sink)(-[a-z]+)*$/) {
                checked("packages", t, (t in packages) || path_found(t "/Cargo.toml"))
                next
            }
            # Code: a macro, a type, a Rust path, a snake_case name; generics and call
            # arguments are not part of the name.
            n = t
            if (n ~ /^[a-z_][a-z0-9_]*!$/) {
                sub(/!$/, "", n)
                checked("macros", t, n in names)
                next
            }
            if (n ~ /\)$/) sub(/\(.*\)$/, "", n)
            if (n ~ />$/) sub(/<.*>$/, "", n)
            if (n ~ /^[A-Za-z_][A-Za-z0-9_]*(::([A-Za-z_][A-Za-z0-9_]*|\*))+$/) {
                k = split(n, seg, "::")
                ok = 1
                for (i = 1; i <= k; i++) {
                    s = seg[i]
                    if (s == "*" || s == "crate" || s == "self" || s == "super" || s == "Self") continue
                    if (!(s in names) && !(s in packages)) { ok = 0; missing["Rust paths: " t " (" s ")"] = 1 }
                }
                checked("Rust paths", t, 1)
                next
            }
            if (n ~ /^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$/) { checked("types", t, n in names); next }
            if (n ~ /^_?[a-z][a-z0-9]*(_[a-z0-9]+)+$/) { checked("snake_case names", t, n in words); next }
            if (n ~ /^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$/ && length(n) > 1) { checked("constants", t, n in names); next }
            skipped++
        }
        END {
            split("paths,routes,commands,packages,types,Rust paths,macros,constants,snake_case names,allowed", order, ",")
            for (i = 1; i in order; i++) {
                kind = order[i]
                if (count[kind]) printf "%d %s:%s\n", count[kind], kind, list[kind] > report
            }
            printf "%d spans are not names (commands with arguments, SQL, settings, prose)\n", skipped > report
            for (m in missing) print m
        }' \
        part=files "$work/files" part=crates "$work/crates" part=packages "$work/packages" \
        part=commands "$work/commands" part=allowed "$work/allowed" part=index "$index_file" \
        part=spans "$work/spans" | sort >"$work/missing"
    echo "names in $doc:"
    fold -s -w 100 "$work/report" | sed 's/^/  /'
    if [[ -s $work/missing ]]; then
        echo "$doc names what does not exist:" >&2
        sed 's/^/  /' "$work/missing" >&2
        rm -rf "$work"
        return 1
    fi
    rm -rf "$work"
}

names_index=$(mktemp)
trap 'rm -rf "$names_index" "${scratch:-}"' EXIT
repo_files | grep -E '\.(rs|sql)$' | tr '\n' '\0' | index >"$names_index"
check_names ARCHITECTURE.md "$names_index"

# The names check can fail: on names that exist nowhere, and on a type renamed in a
# scratch copy of the sources.
scratch=$(mktemp -d)
cp ARCHITECTURE.md "$scratch/bogus.md"
printf '\n`NoSuchTypeAnywhere`, `outbox-core/src/no_such_file.rs`, `outbox_engine::no_such_module`, `outbox no-such-command`\n' >>"$scratch/bogus.md"
if (check_names "$scratch/bogus.md" "$names_index") >"$scratch/out" 2>&1; then
    echo "the names check passed bogus names: it is broken" >&2
    exit 1
fi
# missing FILE: the missing names a failed check listed.
missing() { sed -n '/names what does not exist:$/,$p' "$1" | sed 1d; }
for bogus in NoSuchTypeAnywhere no_such_file.rs no_such_module no-such-command; do
    missing "$scratch/out" | grep -q "$bogus" || { echo "the names check did not name $bogus" >&2; exit 1; }
done
echo "names self-test: a copy of ARCHITECTURE.md with bogus names fails, naming"
missing "$scratch/out"
mkdir "$scratch/src"
repo_files | grep -E '\.(rs|sql)$' | tar -T - -cf - | tar -xf - -C "$scratch/src"
grep -rlZw RelayBuilder "$scratch/src" | xargs -0 sed -i 's/\bRelayBuilder\b/RelayMaker/g'
(cd "$scratch/src" && find . \( -name '*.rs' -o -name '*.sql' \) -print0 | index) >"$scratch/renamed"
if (check_names ARCHITECTURE.md "$scratch/renamed") >"$scratch/out" 2>&1; then
    echo "the names check missed RelayBuilder renamed in the sources: it is broken" >&2
    exit 1
fi
missing "$scratch/out" | grep -q 'types: RelayBuilder$' || { echo "the names check did not name the renamed RelayBuilder" >&2; cat "$scratch/out" >&2; exit 1; }
echo "names self-test: ARCHITECTURE.md against a scratch copy of the sources with RelayBuilder renamed fails, naming"
missing "$scratch/out"

[[ ${1:-} == --names ]] && exit 0

# ---------------------------------------------------------------------------------------
# 2. Dependency invariants
# ---------------------------------------------------------------------------------------

forbidden='^(sqlx|sqlx-[a-z-]+|diesel|diesel_[a-z_]+|reqwest|hyper|hyper-util|rdkafka|rdkafka-sys|lapin|amq-protocol|async-nats|rumqttc|redis|aws-[a-z-]+|tokio-postgres|postgres|mysql[a-z_-]*|rusqlite|libsqlite3-sys)$'

# check CRATE CARGO-TREE-ARGS...: CRATE's normal dependency tree holds no forbidden crate.
check() {
    local crate=$1
    shift
    local deps bad
    deps=$(cargo tree -p "$crate" -e normal "$@" --prefix none --format '{p}' | cut -d' ' -f1 | sort -u)
    bad=$(grep -E "$forbidden" <<<"$deps" || true)
    if [[ -n "$bad" ]]; then
        echo "$crate ($*) must not depend on database, broker or HTTP client crates; found:" >&2
        echo "$bad" >&2
        exit 1
    fi
    echo "$crate ($*): $(wc -l <<<"$deps") crates in its normal dependency tree, no database, broker or HTTP client"
}

check outbox-engine --all-features
check outbox-receiver --all-features
# The dashboard reads any store through the core's traits.
check outbox-dashboard --all-features
# The front crate with only the receiver's features: the receiving side of a service.
check outbox --no-default-features --features receiver-axum

# The check can fail: it must find the HTTP client the HTTP sink is built on.
if (check outbox-sink-http) >/dev/null 2>&1; then
    echo "the invariant check found no HTTP client in outbox-sink-http: the check is broken" >&2
    exit 1
fi

# The README's first command, `cargo run --example quickstart` at the root, builds the
# default members (the examples package alone, default features) with their dev and build
# dependencies: no system library (libpq, libmysqlclient), no C broker client, no AWS SDK.
quickstart_forbidden='^(mysqlclient-sys|pq-sys|rdkafka-sys|rdkafka|lapin|async-nats|rumqttc|aws-sdk-[a-z]+|diesel|diesel-async|opentelemetry[a-z_-]*)$'
quickstart=$(cargo tree -e normal,build,dev --prefix none --format '{p}' | cut -d' ' -f1 | sort -u)
bad=$(grep -E "$quickstart_forbidden" <<<"$quickstart" || true)
if [[ -n $bad ]]; then
    echo "cargo run --example quickstart would build what the quickstart does not use:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "quickstart: $(wc -l <<<"$quickstart") crates, none of them a system-library binding, broker client or AWS SDK"
# ... and the same check finds them in the workload examples.
workloads=$(cargo tree -p outbox-examples --features workloads -e normal --prefix none --format '{p}' | cut -d' ' -f1)
if ! grep -qE "$quickstart_forbidden" <<<"$workloads"; then
    echo "the quickstart check found nothing in the workload examples: the check is broken" >&2
    exit 1
fi
