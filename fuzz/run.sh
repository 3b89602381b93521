#!/usr/bin/env bash
# Fuzz every target in turn on ONE core, then minimise the corpus.
# usage: fuzz/run.sh [seconds per target (default 300)] [targets...]
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); on a stable toolchain it runs with
# RUSTC_BOOTSTRAP=1. Stats go to fuzz/logs/summary.txt (not committed).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(message update_as2 update_as4 open notification route_refresh bfd_control cni_netconf cni_env)
export RUSTC_BOOTSTRAP=1 CARGO_BUILD_JOBS=1
cargo fuzz build -O
mkdir -p logs
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    case $t in message) max_len=8192 ;; *) max_len=4200 ;; esac
    start=$(date +%s)
    (cd logs && cargo fuzz run -O --fuzz-dir .. "$t" "../corpus/$t" -- \
        -jobs=1 -workers=1 -max_total_time="$secs" -timeout=5 -max_len=$max_len -rss_limit_mb=2048 \
        >"run-$t.txt" 2>&1) || echo "$t: fuzzer exited non-zero (see logs/)"
    end=$(date +%s)
    runs=$(grep -hoE 'Done [0-9]+ runs' logs/fuzz-0.log | tail -1 || true)
    mv logs/fuzz-0.log "logs/fuzz-$t.log" 2>/dev/null || true
    echo "$t: $((end - start)) s, ${runs:-? runs}, corpus $(ls "corpus/$t" | wc -l) files" | tee -a logs/summary.txt
done
