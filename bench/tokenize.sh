#!/usr/bin/env bash
# Tokenizer throughput: data's BenchmarkByteEncode, BenchmarkGPT2Encode (merge
# cache warm) and BenchmarkGPT2EncodeCold (empty cache) against the npm
# reference gpt-tokenizer (bench/tokenize_node.js, its cache warm) on the
# same 4 MiB of text, one after the other in one run, after checking that
# `skein tokenize --tokenizer gpt2` and gpt-tokenizer give the same ids for
# all of it. Needs node and the npm registry (skipped without them).
#   bash bench/tokenize.sh            # COUNT=3 benchmark runs, RUNS=3 node runs
# The text: $GOROOT/doc/go_spec.html, go_mem.html and godebug.md, then the
# .go files of $GOROOT/src outside testdata in byte order of their paths,
# cut at 4 MiB (what the benchmarks read when SKEIN_TOKENIZER_BENCH_TEXT is
# unset).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
goroot=$(go env GOROOT)
{
  cat "$goroot/doc/go_spec.html" "$goroot/doc/go_mem.html" "$goroot/doc/godebug.md"
  find "$goroot/src" -name testdata -prune -o -name '*.go' -type f -print | LC_ALL=C sort | xargs cat
} 2>/dev/null | head -c 4194304 >"$work/text" || true
echo "text: $(wc -c <"$work/text") bytes, sha256 $(sha256sum "$work/text" | cut -c1-16)..."
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"

go build -o "$work/skein" ./cmd/skein
"$work/skein" tokenize --tokenizer gpt2 "$work/text" >"$work/gpt2.json"
if command -v node >/dev/null && (cd "$work" && npm install --silent --no-save gpt-tokenizer@4.0.0 >/dev/null 2>&1); then
  node=1
else
  node=0
  echo "node or the npm registry unavailable: no comparison"
fi

SKEIN_TOKENIZER_BENCH_TEXT="$work/text" go test -run '^$' -bench 'ByteEncode|GPT2Encode' \
  -benchtime 10x -count "${COUNT:-3}" ./data | grep -E '^(Benchmark|cpu:)'
if [ "$node" = 1 ]; then
  NODE_PATH="$work/node_modules" RUNS="${RUNS:-3}" node bench/tokenize_node.js "$work/text" "$work/gpt2.json"
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
