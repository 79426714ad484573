#!/usr/bin/env bash
# Churn in a staged run over `skein node join` (BENCHMARKS.md, "Staged
# volunteers over skein node join: churn"). Starts a bootstrap with a
# 3-stage tiny manifest (batch 2 x 32, 2 microbatches, H = 4) and three
# volunteers on loopback (LAN membership timing); after 20 s it kills -9 the
# member of stage KILLSTAGE (default 1) and starts a fourth volunteer at
# once, then times, polling the consoles every 0.1 s: when the survivors see
# the member gone, and when they take the bootstrap's re-plan.
#   bash bench/staged_churn.sh            KILLSTAGE=2 bash bench/staged_churn.sh
set -uo pipefail
cd "$(dirname "$0")/.."
KILLSTAGE="${KILLSTAGE:-1}"
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
go build -o "$dir/skein" ./cmd/skein
cat >"$dir/run.toml" <<'TOML'
run_id = "staged-churn"
[model]
preset = "tiny"
batch = 2
seq_len = 32
[optimizer]
kind = "diloco"
inner_steps = 4
inner_lr = 0.003
warmup = 4
[data]
source = "shards"
[pipeline]
stages = 3
microbatches = 2
TOML
net=(--listen /ip4/127.0.0.1/udp/0/quic-v1 --timing lan)
"$dir/skein" bootstrap --manifest "$dir/run.toml" --corpus "$(go env GOROOT)/src/strings" --data-dir "$dir/bs" "${net[@]}" >"$dir/bs.log" 2>&1 &
for _ in $(seq 100); do grep -q "/p2p/" "$dir/bs.log" && break; sleep 0.1; done
addr=$(grep -m1 "/p2p/" "$dir/bs.log" | tr -d ' ')
for i in 1 2 3; do
  "$dir/skein" node join --bootstrap "$addr" --data-dir "$dir/v$i" --threads 1 "${net[@]}" >"$dir/v$i.log" 2>&1 &
done
sleep 20
victim=""; first=""
for i in 1 2 3; do
  grep -q "stage $KILLSTAGE of" "$dir/v$i.log" && victim=$i
  grep -q "stage 0 of" "$dir/v$i.log" && first=$i
done
[ -n "$victim" ] && [ -n "$first" ] || { echo "the volunteers were not placed:"; cat "$dir"/*.log; exit 1; }
now() { date +%s.%N; }
t0=$(now)
pkill -9 -f "data-dir $dir/v$victim " || true
"$dir/skein" node join --bootstrap "$addr" --data-dir "$dir/v4" --threads 1 "${net[@]}" >"$dir/v4.log" 2>&1 &
gone=""; replan=""
while [ -z "$replan" ]; do
  el=$(echo "$(now) - $t0" | bc)
  [ -z "$gone" ] && grep -q "left the run" "$dir/v$first.log" && gone=$el
  grep -q "stage plan [2-9]" "$dir/v$first.log" && replan=$el
  [ "$(echo "$el > 120" | bc)" = 1 ] && break
  sleep 0.1
done
echo "killed -9 the member of stage $KILLSTAGE; the survivors saw it gone after ${gone:-?} s and took the re-plan after ${replan:-never} s"
grep -h "stage plan" "$dir/bs.log"
grep -h "stage plan\|left the\|rebuilt\|took\|fresh\|could not" "$dir"/v*.log
