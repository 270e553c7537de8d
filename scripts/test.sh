#!/usr/bin/env bash
# Run every test: formatting, lints, unit, the fuzz targets' corpora,
# property, vector, command, documentation, C and Python tests.
#
# Every step runs even when an earlier one fails (one failing Rust test must
# not hide the Python suite); the run ends with a summary, each step with
# PASS or FAIL and its duration, whose last line is exactly "N passed, N
# failed" (CI reads it), and exits 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

summary=()
passed=0
failed=0

# Every step runs with a temporary directory of its own, private (mode 0700,
# as mktemp -d makes it: a test that needs another user to reach its files
# must say so), which must be empty again at the end: the tests leave
# nothing behind. Made in the TMPDIR the run was given, removed at the end.
outer_tmp=${TMPDIR:-/tmp}
run_tmp=$(mktemp -d "$outer_tmp/blkhash-test.XXXXXX")
export TMPDIR=$run_tmp

# Each step's output is also kept (outside the run's temporary directory,
# which must end empty), so that the end of the run can repeat the last
# lines of the steps that failed: CI shows only the end of a run's output.
logs=$(mktemp -d "$outer_tmp/blkhash-test-logs.XXXXXX")
trap 'rm -rf "$run_tmp" "$logs"' EXIT
failures=()

# step NAME COMMAND...: run COMMAND (its output as it comes), record the result.
step() {
    local name=$1 start=$SECONDS rc log
    shift
    log=$logs/$((passed + failed)).log
    echo "==> $name"
    # tee through a process substitution, not a pipe: the step runs in this
    # shell, and a server a test failed to stop, holding the output, cannot
    # stall the run (tee is waited for 10 s at most, its last lines printed
    # before the step's result).
    local out tee_pid
    exec {out}> >(tee "$log")
    tee_pid=$!
    "$@" >&"$out" 2>&1
    rc=$?
    exec {out}>&-
    for _ in $(seq 100); do
        kill -0 "$tee_pid" 2>/dev/null || break
        sleep 0.1
    done
    local took=$((SECONDS - start))
    local t
    t=$(printf '%dm%02ds' $((took / 60)) $((took % 60)))
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        summary+=("$(printf 'PASS  %8s  %s' "$t" "$name")")
    else
        failed=$((failed + 1))
        summary+=("$(printf 'FAIL  %8s  %s (exit %d)' "$t" "$name" "$rc")")
        failures+=("$name|$log")
    fi
    echo "==> $name: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL (exit $rc)") in $t"
}

# What each failed step said of its failures (a Rust test's panic and the
# lines after it, pytest's FAILED lines: cargo test's last lines are its
# doc tests, printed after the failure), then its last lines (the build's
# progress lines left out).
failed_tails() {
    local f name log
    for f in "${failures[@]}"; do
        name=${f%%|*} log=${f#*|}
        echo
        echo "==> the failures the failed step reported: $name"
        grep -E -A4 "panicked at |^FAILED |^ERROR " "$log" | head -n 40
        echo "==> the last lines of the failed step: $name"
        grep -v '^ *\(Compiling\|Checking\|Downloaded\|Fresh\) ' "$log" | tail -n 25
    done
}

step "setup (scripts/setup.sh)" scripts/setup.sh
step "cargo fmt --check" cargo fmt --all -- --check
# No module imports a module that imports it, in any crate, and blkimage's
# layers (storage, formats, open) import only downward.
step "import circles (scripts/check-imports.py)" scripts/check-imports.py
step "cargo clippy" cargo clippy --workspace --all-targets --release -- -D warnings
# The API documentation builds without a warning (a broken link, a private item).
step "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# The release build: what the documentation examples, the install, Python
# and package steps use (the debs are made from it). In two builds, as
# they build: what scripts/install.sh installs (the commands, libblkhash),
# as it and the debs build it, then the Python extension alone, as maturin
# does. One build of the workspace would give some dependencies the union
# of their features, and the narrower builds after it would compile them,
# and link every command, again.
step "cargo build" sh -c 'cargo build --release -p blksum -p blktools -p libblkhash &&
    cargo build --release -p blkhash-python'
# Every test binary runs, and every failure is reported, not only the first.
# Built with the quick profile (Cargo.toml: the release optimizations
# without link-time ones, whose links of every test binary were most of
# this step's time); first libblkhash.so of that profile, which the C API's
# tests link and cargo test does not build (the crate is a C library, no
# rlib).
# Among them the fuzz regression: every fuzz target's committed corpus
# through its checks, each input once (fuzz-checks; the sanitizer build and
# fuzzing for new inputs: scripts/fuzz.sh, fuzz/README.md).
# A hung test fails the run after 40 minutes instead of stalling CI (libtest
# names a test running for over 60 s, which points at the hang).
rust_tests() {
    cargo build --profile quick -p libblkhash || return
    timeout --kill-after=30 2400 cargo test --workspace --profile quick --no-fail-fast
}
step "cargo test" rust_tests
# Every shell example of the README and docs/guide/ run, its output checked
# (on the release build of the step before).
step "docs examples (scripts/test-docs.py)" scripts/test-docs.py
# scripts/install.sh into a scratch prefix: the commands, the C library
# through pkg-config, the manual pages.
step "install (scripts/test-install.sh)" scripts/test-install.sh
# The Python package, built and installed as a user would, and its tests.
step "python (scripts/test-python.sh)" scripts/test-python.sh
# The C library's ABI against libblkhash 0.11's, the crates' publish dry
# run, and the debs built, installed, used and removed (the RPMs:
# scripts/package.sh --rpm).
step "package (scripts/test-package.sh)" scripts/test-package.sh
# The static musl tarball of this architecture, its blksum run in an empty
# chroot on every reference vector.
step "static (scripts/test-static.sh)" scripts/test-static.sh
# arm64: the workspace cross-compiled, its unit, property and vector tests
# and blksum on real images under qemu-user (no speed figures: emulated).
# A missing cross tool or Rust target fails this step, naming it.
step "arm64 (scripts/test-cross.sh)" scripts/test-cross.sh

# What the steps left in the temporary directory (the run's own, above).
left_behind() {
    local left
    left=$(ls -A "$run_tmp")
    if [ -n "$left" ]; then
        echo "left in the temporary directory $run_tmp by the steps above:"
        printf '%s\n' "$left" | sed 's/^/  /'
        return 1
    fi
}
step "nothing left in the temporary directory" left_behind

echo
echo "==> summary"
printf '%s\n' "${summary[@]}"
failed_tails
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
