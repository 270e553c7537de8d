#!/usr/bin/env bash
# Fuzz every parser of untrusted bytes: scripts/fuzz.sh [SECONDS]
#
#   scripts/fuzz.sh 0      each target runs every input of its corpus once
#                          and nothing new, under the address sanitizer (the
#                          test command replays the committed corpora
#                          without it, in cargo test: fuzz-checks)
#   scripts/fuzz.sh 600    each target fuzzes for 600 s (default 60): new
#                          inputs, the way bugs are found (fuzz/README.md)
#
# A target's corpus is fuzz/corpus/TARGET: when empty, it starts from the
# committed corpus (fuzz/seeds/TARGET: what long runs ended with, and small
# valid inputs made by qemu-img, blkmap and from the protocols' specs).
# Needs cargo-fuzz (installed here if missing) and a nightly
# toolchain, or a stable one made to accept nightly flags (below). Every
# target runs; each gets one line here (executions, seconds, result) and
# its whole libFuzzer output in target/fuzz-logs/TARGET.log. Crashes land
# in fuzz/artifacts/TARGET/ and make this script fail once all targets ran.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-60}
case $seconds in
    '' | *[!0-9]*)
        echo "usage: scripts/fuzz.sh [SECONDS] (0: each corpus input once)" >&2
        exit 2
        ;;
esac
targets=(qcow2 nbd_reply nbd_transmission nbd_handshake blkmap fidx check_file state record http_reply http_direct vnbd compressed)

# cargo fuzz builds with nightly-only flags (-Zsanitizer=address and the
# sanitizer coverage options libFuzzer needs): a nightly toolchain when one
# is installed (rustup toolchain install nightly); on a machine with only a
# stable one (rustup's default, what the test command can count on),
# RUSTC_BOOTSTRAP=1 lets that stable compiler accept the flags. It is set
# for this script's fuzz builds only (their own workspace and target
# directory, fuzz/target), never for the builds that are shipped or tested.
toolchain=(+nightly)
if ! cargo +nightly --version >/dev/null 2>&1; then
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
# cargo-fuzz is a cargo subcommand: it has to be installed where cargo
# finds it (~/.cargo/bin, as any `cargo install`), at the versions of its
# lock file.
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install --locked cargo-fuzz)" >&2
    cargo install --locked cargo-fuzz
fi
logs=$(cd .. && pwd)/target/fuzz-logs
mkdir -p "$logs"

failures=()
for t in "${targets[@]}"; do
    corpus=corpus/$t
    mkdir -p "$corpus"
    # The committed corpus (what long runs ended with, minimized, and small
    # valid inputs): a short run starts there.
    if [ -z "$(ls -A "$corpus")" ]; then
        cp seeds/"$t"/* "$corpus"/
    fi
    log=$logs/$t.log
    start=$SECONDS
    # -runs=0: the corpus only (libFuzzer runs every input of it once).
    if [ "$seconds" -eq 0 ]; then
        limit=(-runs=0)
    else
        limit=(-max_total_time="$seconds")
    fi
    if cargo "${toolchain[@]}" fuzz run -O "$t" "$corpus" -- \
        "${limit[@]}" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
        >"$log" 2>&1; then
        result=ok
    else
        result="FAILED (exit $?)"
        failures+=("$t")
    fi
    # libFuzzer's last words on a clean end: "Done N runs in S second(s)".
    done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)
    runs=$(awk '{print $2}' <<<"$done_line")
    secs=$(awk '{print $5}' <<<"$done_line")
    printf 'fuzz: %-17s %10s runs in %4s s (%4d s with the build): %s\n' \
        "$t" "${runs:-?}" "${secs:-?}" $((SECONDS - start)) "$result"
    if [ "$result" != ok ]; then
        # What went wrong (the crash, the build error), without the log's bulk.
        tail -n 40 "$log" | sed "s/^/fuzz: $t: /"
    fi
done
echo "fuzz: whole output in $logs/"
if [ ${#failures[@]} -gt 0 ]; then
    echo "fuzz: failed: ${failures[*]} (crash inputs in fuzz/artifacts/)" >&2
    exit 1
fi
