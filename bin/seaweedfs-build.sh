#!/usr/bin/env bash
# Build SeaweedFS's `weed` (the S3-compatible server the object-storage tests and benchmarks start on
# 127.0.0.1) from the Go module proxy, once, and cache the binary. Prints the binary's path.
#
# `go install github.com/seaweedfs/seaweedfs/weed@V` is refused because SeaweedFS's go.mod carries a
# `replace` line, so a tiny wrapper module requires SeaweedFS, repeats that replace, and builds ./weed.
# About 8 minutes on 2 cores the first time; afterwards the cached binary is reused.
set -euo pipefail
VERSION="${MQ_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
CACHE="${MQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lakemq}/seaweedfs/$VERSION"
BIN="$CACHE/weed"
if [ -x "$BIN" ] && "$BIN" version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi
command -v go >/dev/null 2>&1 || { echo "seaweedfs-build: Go is not installed (needed to build SeaweedFS)" >&2; exit 1; }
mkdir -p "$CACHE"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
cat > go.mod <<MOD
module lakemq.local/weedbuild

go 1.26

require github.com/seaweedfs/seaweedfs $VERSION

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
MOD
cat > tools.go <<'SRC'
//go:build tools

package weedbuild

import _ "github.com/seaweedfs/seaweedfs/weed"
SRC
echo "seaweedfs-build: resolving modules of SeaweedFS $VERSION" >&2
GOFLAGS=-mod=mod go mod tidy >&2
echo "seaweedfs-build: compiling weed (several minutes the first time)" >&2
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -o "$BIN.tmp" github.com/seaweedfs/seaweedfs/weed >&2
mv "$BIN.tmp" "$BIN"
echo "$BIN"
