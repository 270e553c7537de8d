#!/usr/bin/env bash
# Build blksum and install it with its manual page and shell completions:
#   scripts/install.sh [PREFIX]      (default /usr/local)
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${1:-/usr/local}
cargo build --release -p blksum -p blktools
bin=target/release/blksum

for b in blksum blkmap blkdiff blksync; do
    install -D -m 755 "target/release/$b" "$prefix/bin/$b"
done
mkdir -p "$prefix/share/man/man1" \
    "$prefix/share/bash-completion/completions" \
    "$prefix/share/zsh/site-functions" \
    "$prefix/share/fish/vendor_completions.d"
"$bin" --man > "$prefix/share/man/man1/blksum.1"
"$bin" --completions bash > "$prefix/share/bash-completion/completions/blksum"
"$bin" --completions zsh > "$prefix/share/zsh/site-functions/_blksum"
"$bin" --completions fish > "$prefix/share/fish/vendor_completions.d/blksum.fish"
echo "installed blksum (with its manual page and completions), blkmap, blkdiff, blksync in $prefix/bin"
