#!/usr/bin/env bash
# The fuzz campaign: every target in fuzz/fuzz_targets under libFuzzer (cargo-fuzz, on
# the nightly toolchain), each until it has run 10 million inputs or for SECONDS
# (default 1800), whichever comes first. New inputs go into fuzz/corpus/<target>
# (minimised at the end with `cargo fuzz cmin`), crashes into fuzz/artifacts/<target>.
# A crash becomes a regression: fix it, then copy the input to
# fuzz/regressions/<target>/, which `cargo test` replays (tests/fuzz_corpus.rs).
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET ...]
#
# FUZZ_SANITIZER: address (default) or none (about twice the executions per second,
# but no check of the C libraries' memory use). Per input: 2 GiB of RSS and 10 s at
# most, so a header that claims a huge array must fail, not allocate.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-1800}"
shift || true
sanitizer="${FUZZ_SANITIZER:-address}"
target_dir="${FUZZ_TARGET_DIR:-$HOME/.cache/shardflow/fuzz-target}"

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
rustup toolchain list | grep -q '^nightly' || {
    echo "cargo-fuzz needs a nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
}

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

fuzz=(cargo +nightly fuzz)
common=(-s "$sanitizer" --target-dir "$target_dir")
"${fuzz[@]}" build "${common[@]}"

mkdir -p fuzz/logs
summary="fuzz/logs/summary.tsv"
printf 'target\texecutions\tseconds\tcoverage\tfeatures\tcorpus\tcrashes\n' > "$summary"
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    log="fuzz/logs/$t.log"
    echo "== $t (${seconds}s or 10M runs)"
    status=0
    "${fuzz[@]}" run "${common[@]}" "$t" "fuzz/corpus/$t" -- \
        -runs=10000000 -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
        -timeout=10 -max_len=65536 -print_final_stats=1 -close_fd_mask=1 >"$log" 2>&1 || status=$?
    # (A target that crashed prints no "Done" line: its counts come from its last status.)
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
    secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' | tail -1 || true)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*' || true)
    ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*' || true)
    corp=$(grep -o 'corp: [0-9]*' <<<"$last" | grep -o '[0-9]*' || true)
    crashes=$(find "fuzz/artifacts/$t" -type f | wc -l)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${runs:-?}" "${secs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes" >> "$summary"
    if [ "$status" -ne 0 ]; then
        echo "   $t stopped with status $status: see $log and fuzz/artifacts/$t" >&2
    fi
    "${fuzz[@]}" cmin "${common[@]}" "$t" "fuzz/corpus/$t" -- -rss_limit_mb=2048 -timeout=10 >/dev/null 2>&1 || true
done
column -t "$summary"
