#!/usr/bin/env bash
# Run a command as if on an AVX2-only CPU (no AVX-512, no native bf16), on a machine that has AVX-512 / AVX512-BF16.
#
#   bash scripts/emulate_avx2.sh bash train_ppo.sh            # a launch script's default run
#   bash scripts/emulate_avx2.sh bash scripts/test.sh         # the test suite
#
# Developers' machines and CI are of either kind, and the defaults must be fast on both (`auto` precision = fp32
# where bf16 is not native). This makes the other kind reproducible on one machine:
#   - ATEN_CPU_CAPABILITY=avx2: torch's own vectorised kernels use their AVX2 builds;
#   - ONEDNN_MAX_CPU_ISA=AVX2: oneDNN (bf16 matmuls, convolutions) dispatches no AVX-512 / AMX / AVX512-BF16 code,
#     so a bf16 matmul falls back to the slow emulated path, as on a real AVX2 CPU (measured on an AVX512-BF16 EPYC,
#     one thread, 1024^2: bf16 213 -> 0.9 GFLOP/s, the ~60x gap an AVX2-only CPU shows);
#   - MKL_ENABLE_INSTRUCTIONS=AVX2: MKL's fp32 GEMM restricted the same way;
#   - RAGEN_NATIVE_BF16=0: ragen's detection reads /proc/cpuinfo flags, which still list avx512_bf16, so `auto` is
#     told the answer an AVX2 CPU gives (fp32).
# What it cannot emulate: the fp32 speed of the other machine (fp32 GEMM ran at 86 GFLOP/s here with or without
# these settings; an AVX2-only EPYC we measured ran at 49), so wall times are a lower bound for such a CPU.
set -euo pipefail
if [ "$#" -eq 0 ]; then
    echo "usage: bash scripts/emulate_avx2.sh COMMAND [ARGS...]" >&2
    exit 2
fi
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 RAGEN_NATIVE_BF16=0
exec "$@"
