#!/usr/bin/env bash
# Join-to-first-step of a volunteer on a large corpus, over an emulated WAN
# link (BENCHMARKS.md, "Packed datasets"): the same corpus as corpus shards
# (data.source = "shards": every volunteer downloads all of it first) and as
# a packed dataset (skein data pack, bootstrap --dataset: a volunteer fetches
# the chunks of its block). Prints each volunteer's time from command start
# to its first training step and what its data directory holds.
#   bash bench/join_dataset.sh        RATE=50 LAT=30ms CORPUS=/usr/local/go/src bash bench/join_dataset.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${RATE:-50}" LAT="${LAT:-30ms}" CORPUS="${CORPUS:-$(go env GOROOT)/src}"
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
go build -o "$dir/skein" ./cmd/skein
emu=(--emulate-rate "$RATE" --emulate-latency "$LAT" --listen /ip4/127.0.0.1/udp/0/quic-v1 --timing lan)
"$dir/skein" data pack --tokenizer byte --format text --val-fraction 0.001 --out "$dir/ds" "$CORPUS" 2>/dev/null | sed 's/^/  pack: /'
first() { sed -n 's/^first training step \([0-9.]*\)s after starting.*/\1/p' "$1"; }
run() { # name, bootstrap flags...
  local name=$1; shift
  "$dir/skein" --log-level warn bootstrap --data-dir "$dir/bs-$name" "${emu[@]}" "$@" >"$dir/bs-$name.out" 2>"$dir/bs-$name.err" &
  local bs=$!
  for _ in $(seq 600); do [ -s "$dir/bs-$name.out" ] && break; sleep 0.2; done
  "$dir/skein" --log-level warn node join --bootstrap "$(head -1 "$dir/bs-$name.out")" --data-dir "$dir/v-$name" \
    --threads 1 --rounds 1 "${emu[@]}" >"$dir/v-$name.log" 2>&1
  kill -INT $bs; wait $bs || true
  printf '%-8s first step %7ss after starting; its data: %s (shards/ or tokens/; the rest of the data directory is the checkpoint)\n' \
    "$name" "$(first "$dir/v-$name.log")" "$(du -sh "$dir/v-$name/shards" "$dir/v-$name/tokens" 2>/dev/null | cut -f1)"
}
echo "link: $RATE Mbit/s, $LAT one way; corpus $CORPUS ($(du -sh "$CORPUS" | cut -f1))"
run shards --corpus "$CORPUS"
run dataset --dataset "$dir/ds"
