#!/usr/bin/env bash
# The outside users' crates (tests/outside): each builds alone, so that a feature another
# workspace member turns on cannot hide one it lacks, and depends on nothing (crate or
# `outbox` feature) that README.md does not name. Their tests run with the others.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
for manifest in tests/outside/*/Cargo.toml; do
    # "name" lines: the package, then each dependency and each feature of `outbox` it asks for
    mapfile -t names < <(python3 - "$manifest" <<'PY'
import sys, tomllib
manifest = tomllib.load(open(sys.argv[1], "rb"))
print(manifest["package"]["name"])
for table in ("dependencies", "dev-dependencies"):
    for name, spec in manifest.get(table, {}).items():
        print(name)
        if name == "outbox" and isinstance(spec, dict):
            for feature in spec.get("features", []):
                print(feature)
PY
    )
    package=${names[0]}
    for name in "${names[@]:1}"; do
        if ! grep -qF "\`$name\`" README.md; then
            echo "$manifest uses \`$name\`, which README.md does not name" >&2
            status=1
        fi
    done
    echo "building $package alone"
    cargo build --quiet -p "$package" --all-targets || status=1
done
exit "$status"
