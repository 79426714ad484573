#!/usr/bin/env bash
# Training throughput of Skein's CPU backend against the PyTorch reference
# (bench/torch_gpt.py), measured side by side in one run. Prints a markdown
# table for BENCHMARKS.md. Installs Debian's python3-torch if missing.
#   bash bench/train_throughput.sh            # tiny B=16 and small B=8, 1 thread and all cores
# Torch runs with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset, so it may use its
# AVX-512 kernels (the environment pins Haswell for old OpenBLAS builds).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-20}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >/dev/null
fi
go build -o /tmp/skein-bench ./cmd/skein
cores=$(nproc)
echo "| preset | batch | threads | skein tokens/s | torch tokens/s | ratio |"
echo "|---|---|---|---|---|---|"
for cfg in "tiny 16" "small 8"; do
  set -- $cfg
  for th in 1 "$cores"; do
    s=$(/tmp/skein-bench bench train --preset "$1" --batch "$2" --threads "$th" --steps "$STEPS")
    t=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/torch_gpt.py --preset "$1" --batch "$2" --threads "$th" --steps "$STEPS")
    /usr/bin/python3 - "$s" "$t" "$1" "$2" "$th" <<'PY'
import json, sys
s, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {s['tokens_per_sec']:.0f} | {t['tokens_per_sec']:.0f} | {s['tokens_per_sec']/t['tokens_per_sec']:.2f}x |")
PY
  done
done
