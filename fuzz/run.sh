#!/usr/bin/env bash
# Fuzz every target in turn on ONE core, then minimise the corpus.
# usage: fuzz/run.sh [seconds per target (default 300)] [targets...]
# With cargo-fuzz (`cargo install cargo-fuzz --locked`) it runs `cargo fuzz`; on a stable
# toolchain that runs with RUSTC_BOOTSTRAP=1. Without cargo-fuzz (a machine with no crates.io
# access) it does what `cargo fuzz build -O` / `run` do: a nightly toolchain builds the
# targets with the same sanitizer-coverage flags and AddressSanitizer, and runs the libFuzzer
# binaries directly. Stats go to fuzz/logs/summary.txt (not committed).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(message update_as2 update_as4 open notification route_refresh bfd_control cni_netconf cni_env)
export CARGO_BUILD_JOBS=1
host=$(rustc -vV | sed -n 's/^host: //p')
if command -v cargo-fuzz >/dev/null; then
    export RUSTC_BOOTSTRAP=1
    cargo fuzz build -O
    run_target() { (cd logs && cargo fuzz run -O --fuzz-dir .. "$1" "../corpus/$1" -- "${@:2}"); }
else
    rustup run nightly rustc --version >/dev/null 2>&1 \
        || { echo "fuzz/run.sh: needs cargo-fuzz or a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1; }
    # cargo-fuzz 0.12's flags for `build -O` with its default address sanitizer.
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions \
-Coverflow-checks -Zsanitizer=address" \
        cargo +nightly build --release --target "$host" --bins
    run_target() { (cd logs && "../target/$host/release/$1" "../corpus/$1" "${@:2}"); }
fi
mkdir -p logs
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    case $t in message) max_len=8192 ;; *) max_len=4200 ;; esac
    start=$(date +%s)
    run_target "$t" -jobs=1 -workers=1 -max_total_time="$secs" -timeout=5 -max_len=$max_len \
        -rss_limit_mb=2048 >"logs/run-$t.txt" 2>&1 || echo "$t: fuzzer exited non-zero (see logs/)"
    end=$(date +%s)
    runs=$(grep -hoE 'Done [0-9]+ runs' logs/fuzz-0.log | tail -1 || true)
    mv logs/fuzz-0.log "logs/fuzz-$t.log" 2>/dev/null || true
    echo "$t: $((end - start)) s, ${runs:-? runs}, corpus $(ls "corpus/$t" | wc -l) files" | tee -a logs/summary.txt
done
