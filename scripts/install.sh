#!/usr/bin/env bash
# Build blksum and install it with its manual page and shell completions:
#   scripts/install.sh [PREFIX]      (default /usr/local)
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${1:-/usr/local}
cargo build --release -p blksum
bin=target/release/blksum

install -D -m 755 "$bin" "$prefix/bin/blksum"
mkdir -p "$prefix/share/man/man1" \
    "$prefix/share/bash-completion/completions" \
    "$prefix/share/zsh/site-functions" \
    "$prefix/share/fish/vendor_completions.d"
"$bin" --man > "$prefix/share/man/man1/blksum.1"
"$bin" --completions bash > "$prefix/share/bash-completion/completions/blksum"
"$bin" --completions zsh > "$prefix/share/zsh/site-functions/_blksum"
"$bin" --completions fish > "$prefix/share/fish/vendor_completions.d/blksum.fish"
echo "installed $prefix/bin/blksum, its manual page and completions"
