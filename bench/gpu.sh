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
		for dev in cuda:0 cuda:0,fp32; do
			$D/skein bench train --device $dev --preset $1 --batch $2 --steps 10 --warmup 2 2>/dev/null || echo "skein $dev $1 failed"
		done
		python3 bench/torch_gpt.py --device cuda --tf32 --preset $1 --batch $2 --steps 10 --warmup 2
		python3 bench/torch_gpt.py --device cuda --preset $1 --batch $2 --steps 10 --warmup 2
	done
	$D/skein bench train --device cpu --threads 0 --preset small --batch 16 --steps 3 --warmup 1
} 2>&1 | tee "$OUT/train.jsonl"
