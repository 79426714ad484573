#!/usr/bin/env bash
# The GPU checks and figures, in one run on a machine with an NVIDIA GPU and
# no Go: the parity tests of every kernel and of 10 training steps, the GEMM
# benchmark, and training throughput side by side with PyTorch on the same
# GPU. Build the binaries first where Go is (bench/gpu.sh build), then run
# it there from the repository root: bench/gpu.sh run [OUTDIR].
set -uo pipefail
D=.devbin
case "${1:-}" in
build)
	mkdir -p $D
	go test -c -o $D/kernels.test ./kernels
	go test -c -o $D/trainer.test ./trainer
	go build -ldflags="-s -w" -o $D/skein ./cmd/skein
	cp "$(gcc -print-file-name=libgomp.so.1)" $D/
	exit 0 ;;
run) ;;
*) echo "usage: bench/gpu.sh build|run [OUTDIR]" >&2; exit 2 ;;
esac
OUT=${2:-${OUT:-/tmp/gpu-out}}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
grep -m1 'model name' /proc/cpuinfo | tee -a "$OUT/gpu.txt"
(cd kernels && ../$D/kernels.test -test.run 'CUDA|SelectDevice|GemmPlans' -test.v 2>&1) > "$OUT/kernels.log"
echo "kernels tests: $(grep -cE '^(--- |    --- )PASS' "$OUT/kernels.log") passed, $(grep -cE -- '--- FAIL' "$OUT/kernels.log") failed"
(cd trainer && ../$D/trainer.test -test.run 'CUDA' -test.v 2>&1) > "$OUT/trainer.log"
grep -E -- '--- |weights after|step 9' "$OUT/trainer.log"
(cd kernels && ../$D/kernels.test -test.run '^$' -test.bench 'CUDAMatmul|CUDAOps' -test.benchtime 20x 2>&1) | tee "$OUT/gemm.txt" | grep -E "Benchmark|FAIL"
{
	for spec in "tiny 16" "small 16" "gpt2-124m 8"; do
		set -- $spec
		for dev in cuda:0 cuda:0,flash cuda:0,fp32; do
			$D/skein bench train --device $dev --preset $1 --batch $2 --steps 10 --warmup 2 2>/dev/null || echo "skein $dev $1 failed"
		done
		python3 bench/torch_gpt.py --device cuda --tf32 --preset $1 --batch $2 --steps 10 --warmup 2
		python3 bench/torch_gpt.py --device cuda --preset $1 --batch $2 --steps 10 --warmup 2
	done
	$D/skein bench train --device cpu --threads 0 --preset small --batch 16 --steps 3 --warmup 1
} 2>&1 | tee "$OUT/train.jsonl"
# The whole path on the GPU: skein train, then a DiLoCo run of a bootstrap
# and two volunteers that train on the GPU (one context each), on loopback.
e2e=$(mktemp -d)
timeout 120 $D/skein train --device cuda:0 --preset small --batch 16 --steps 60 --eval-every 30 --corpus kernels --out "$e2e/train" 2>&1 | tail -4 | tee "$OUT/train-cli.log"
cat >"$e2e/run.toml" <<'TOML'
run_id = "gpu-e2e"
[model]
preset = "small"
batch = 16
[optimizer]
kind = "diloco"
inner_steps = 50
inner_lr = 0.001
warmup = 10
[data]
source = "shards"
TOML
net=(--listen /ip4/127.0.0.1/udp/0/quic-v1 --timing lan)
$D/skein bootstrap --manifest "$e2e/run.toml" --corpus kernels --data-dir "$e2e/bs" "${net[@]}" >"$OUT/e2e-bootstrap.log" 2>&1 &
bs=$!
for _ in $(seq 100); do grep -q "/p2p/" "$OUT/e2e-bootstrap.log" && break; sleep 0.1; done
addr=$(grep -m1 "/p2p/" "$OUT/e2e-bootstrap.log" | tr -d ' ')
for i in 1 2; do
	timeout 150 $D/skein node join --bootstrap "$addr" --data-dir "$e2e/v$i" --device cuda:0 --rounds 3 --min-peers 2 "${net[@]}" >"$OUT/e2e-v$i.log" 2>&1 &
	pids[$i]=$!
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
timeout 60 $D/skein node doctor --bootstrap "$addr" --device cuda:0 "${net[@]}" >"$OUT/e2e-doctor.log" 2>&1
echo "node doctor on the GPU: exit $?"; grep -E "device|memory" "$OUT/e2e-doctor.log"
kill $bs 2>/dev/null
echo "two GPU volunteers, 3 DiLoCo rounds: exit $rc"
grep -h "round\|device\|cuda" "$OUT"/e2e-v1.log | tail -6
# A staged run: two stages, one GPU volunteer each.
cat >"$e2e/staged.toml" <<'TOML'
run_id = "gpu-staged"
[model]
preset = "small"
batch = 16
[optimizer]
kind = "diloco"
inner_steps = 20
inner_lr = 0.001
warmup = 5
[data]
source = "shards"
[pipeline]
stages = 2
microbatches = 4
TOML
$D/skein bootstrap --manifest "$e2e/staged.toml" --corpus kernels --data-dir "$e2e/sbs" "${net[@]}" >"$OUT/staged-bootstrap.log" 2>&1 &
bs=$!
for _ in $(seq 100); do grep -q "/p2p/" "$OUT/staged-bootstrap.log" && break; sleep 0.1; done
addr=$(grep -m1 "/p2p/" "$OUT/staged-bootstrap.log" | tr -d ' ')
for i in 1 2; do
	timeout 120 $D/skein node join --bootstrap "$addr" --data-dir "$e2e/s$i" --device cuda:0 --rounds 3 "${net[@]}" >"$OUT/staged-v$i.log" 2>&1 &
	pids[$i]=$!
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
kill $bs 2>/dev/null
echo "two staged GPU volunteers, 3 rounds: exit $rc"
grep -h "stage\|round\|first" "$OUT"/staged-v1.log | tail -6
