#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each in turn, one process, for FUZZ_SECONDS
# seconds (default 20) or, when FUZZ_RUNS is set, for that many executions; fails on the first
# crash, leak or timeout (libFuzzer saves the input under fuzz/artifacts/<target>/).
# Usage: scripts/fuzz.sh [TARGET...] (default: every target but verbs_endpoint, which needs
# FUZZ_FEATURES=verbs and rdma-core's development files).
# Installs nightly Rust (the sanitizer needs it) and cargo-fuzz when missing. Seeds come from
# fuzz/corpus/<target>/ and stay as committed: what a run learns goes to target/fuzz-corpus/.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! rustup run nightly rustc --version > /dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version > /dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

seconds="${FUZZ_SECONDS:-20}"
features=()
[ -n "${FUZZ_FEATURES:-}" ] && features=(--features "$FUZZ_FEATURES")
if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); else limit=(-max_total_time="$seconds"); fi

cd fuzz
cargo +nightly fuzz build "${features[@]}"
if [ $# -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list | grep -vx verbs_endpoint)
fi
work="../target/fuzz-corpus"
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    start=$(date +%s)
    # One process (no -jobs/-workers): the machine is shared.
    # The engine's scripts do their work in the first few hundred bytes (256 steps at most);
    # longer inputs only slow it down.
    extra=()
    [ "$t" = engine ] && extra=(-max_len=512)
    if ! cargo +nightly fuzz run "${features[@]}" "$t" "$work/$t" "corpus/$t" -- \
        "${limit[@]}" "${extra[@]}" -print_final_stats=1 > "$work/$t.log" 2>&1; then
        tail -n 60 "$work/$t.log"
        echo "fuzz: $t FAILED (log: target/fuzz-corpus/$t.log, input under fuzz/artifacts/$t/)"
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -n 1)
    echo "fuzz: $t ok, ${runs:-?} executions in $(($(date +%s) - start)) s"
done
