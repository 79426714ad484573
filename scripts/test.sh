#!/usr/bin/env bash
# Runs every check CI runs: formatting, vet, all tests, the race detector on
# concurrent packages, and a short run of every fuzz target.
# Needs Go (>= 1.26) and gcc for cgo; installs gcc from Debian if it is missing.
#   bash scripts/test.sh             # full run (a few minutes on 2 cores)
#   FUZZTIME=200000x bash scripts/test.sh   (executions per fuzz target)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-20000x}"  # a count, not a duration: duration budgets hit a Go 1.26 coordinator race (golang/go#75804) that fails with "context deadline exceeded"

if ! command -v gcc >/dev/null; then
  echo "== installing gcc (cgo kernels)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null
fi
# The NAT-traversal test builds network namespaces with iproute2 and nftables;
# it skips itself without them (or without root), so this install is best effort.
if [ "$(id -u)" = 0 ] && { ! command -v nft >/dev/null || ! command -v ip >/dev/null; }; then
  echo "== installing iproute2 and nftables (NAT test)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 nftables >/dev/null) ||
    echo "   could not install them; the NAT test will skip"
fi
# The status page's browser test drives headless Chromium; it skips itself
# without it, so this install is best effort too.
if [ "$(id -u)" = 0 ] && ! command -v chromium >/dev/null; then
  echo "== installing chromium (status page browser test)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ||
    echo "   could not install it; the browser test will skip"
fi
# The CUDA kernels' PTX is checked against a fresh clang build of their
# source (TestPTXUpToDate skips itself without clang): best effort too.
if [ "$(id -u)" = 0 ] && ! command -v clang >/dev/null; then
  echo "== installing clang (the CUDA kernels' PTX check)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null) ||
    echo "   could not install it; the PTX check will skip"
fi
# skein export is checked against an independent GPT-2 in PyTorch
# (model/testdata/torch_gpt2.py; TestExportMatchesPyTorch skips itself
# without it): best effort too.
if [ "$(id -u)" = 0 ] && ! /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
  echo "== installing python3-torch (the Hugging Face export check)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null) ||
    echo "   could not install it; the export check will skip"
fi
command -v go >/dev/null || { echo "Go 1.26 is required: https://go.dev/dl/" >&2; exit 1; }
export CGO_ENABLED=1

echo "== gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then echo "gofmt needed:"; echo "$bad"; exit 1; fi

echo "== go vet"
go vet ./...

echo "== go test"
go test -count=1 ./...

echo "== go test -race (concurrent packages)"
race_pkgs=$(go list ./... | grep -E '/(node|compression|data|p2p|optimizer|bootstrap|pipeline|experiment|transport)(/|$)')
go test -race -count=1 -short $race_pkgs

echo "== fuzz targets, $FUZZTIME each"
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/func //'); do
    echo "-- $pkg $f"
    go test -run='^$' -fuzz="^${f}\$" -fuzztime="$FUZZTIME" "$pkg" >/tmp/skein-fuzz.log 2>&1 || { cat /tmp/skein-fuzz.log; exit 1; }
  done
done
echo "all checks passed"
