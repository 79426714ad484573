#!/usr/bin/env bash
# Join time and download rates of the tiny demo run over an emulated WAN link
# (BENCHMARKS.md, "Joining a run"). Starts a bootstrap (links at RATE Mbit/s,
# LAT one way) and:
#   1. volunteer A with an empty data dir: fetches the corpus shards, then
#      trains ROUNDS rounds alone;
#   2. volunteer B with an empty data dir while A trains: fetches the shards
#      (from the bootstrap and A) and the run's state (from A);
#   3. volunteer A again on its data dir (shards cached, checkpoint resumed).
# Prints each one's time from command start to its first training step, and
# the shard and state download rates as a fraction of the link.
#   bash bench/join_time.sh            RATE=50 LAT=30ms ROUNDS=2 bash bench/join_time.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RATE="${RATE:-50}" LAT="${LAT:-30ms}" ROUNDS="${ROUNDS:-2}"
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
go build -o "$dir/skein" ./cmd/skein
emu=(--emulate-rate "$RATE" --emulate-latency "$LAT" --listen /ip4/127.0.0.1/udp/0/quic-v1 --timing lan)
"$dir/skein" --log-level warn bootstrap --data-dir "$dir/bs" "${emu[@]}" >"$dir/bs.out" 2>"$dir/bs.err" &
for _ in $(seq 100); do [ -s "$dir/bs.out" ] && break; sleep 0.2; done
addr=$(head -1 "$dir/bs.out")
join() { "$dir/skein" --log-level warn node join --bootstrap "$addr" --data-dir "$dir/$1" --threads 1 "${emu[@]}" "${@:2}"; }

join a --rounds "$ROUNDS" >"$dir/a1.log" 2>&1 &
a=$!
for _ in $(seq 600); do grep -q '^round 1:' "$dir/a1.log" 2>/dev/null && break; sleep 0.2; done
join b --rounds 1 >"$dir/b.log" 2>&1
wait $a
join a --rounds 1 >"$dir/a2.log" 2>&1

link=$(awk -v r="$RATE" 'BEGIN { print r * 1e6 / 8 / 1e6 }') # MB/s
first() { sed -n 's/^first training step \([0-9.]*\)s after starting.*/\1/p' "$1"; }
rate() { sed -n "s/^fetched $2: .*(\([0-9.]*\) MB\/s)/\1/p" "$1" | head -1; }
echo "link: $RATE Mbit/s ($link MB/s), $LAT one way; $(grep -m1 -o 'packed the corpus.*' "$dir/bs.err")"
printf '%-44s %8s\n' "join" "to first step"
printf '%-44s %7ss\n' "A: empty data dir (shards from the bootstrap)" "$(first "$dir/a1.log")"
printf '%-44s %7ss\n' "B: empty data dir, run in progress" "$(first "$dir/b.log")"
printf '%-44s %7ss\n' "A again: shards cached, checkpoint resumed" "$(first "$dir/a2.log")"
for f in a1 b; do
  r=$(rate "$dir/$f.log" "the corpus")
  [ -n "$r" ] && echo "$f: corpus shards at $r MB/s = $(awk -v r="$r" -v l="$link" 'BEGIN { printf "%.2f", r / l }') of the link"
done
r=$(rate "$dir/b.log" "the run's state from [A-Za-z0-9]*")
[ -n "$r" ] && echo "b: run's state at $r MB/s = $(awk -v r="$r" -v l="$link" 'BEGIN { printf "%.2f", r / l }') of the link" || true
grep -h 'fetched\|first training' "$dir"/*.log | sed 's/^/  /'
