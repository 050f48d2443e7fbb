#!/usr/bin/env bash
# sluice vs real Triton 2.51, side by side, with the real perf_analyzer: bench/vs_triton.py.
#
#   bench/vs_triton.sh                        # the matrix: 5 models x grpc, http x c=1, 8, 32, 3 rounds
#   bench/vs_triton.sh --quick                # 1 round, shorter windows
#   MODELS="add_sub heavy_batch" CONCURRENCY="1 8 16" ROUNDS=5 bench/vs_triton.sh
#   SLUICE_FLAGS=--grpc-edge=aio bench/vs_triton.sh --models add_sub --protocols grpc
#
# Both servers run at once on one repository (bench-peers' python models plus add_sub without
# batching); every cell is measured as time-adjacent pairs, the order alternating, and the
# table prints each round's sluice/Triton ratio, the median of the paired ratios and flags
# (a round below 1.0, a median below 1.2). Needs ../shared/bench-peers/setup.sh to have run
# once (real Triton and perf_analyzer in $PEERS_DIR, default /tmp/peers). Arguments and the
# environment variables above (and MEASUREMENT_MS, perf_analyzer -p) go to bench/vs_triton.py;
# `bench/vs_triton.sh --help` lists them.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" "$HERE/vs_triton.py" "$@"
