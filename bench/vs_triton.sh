#!/usr/bin/env bash
# sluice vs real Triton 2.51, side by side, with the real perf_analyzer (bench-peers harness).
#
#   bench/vs_triton.sh                       # add_sub, grpc + http, concurrency 1 2 4 8 16 32
#   MODELS="add_sub heavy_batch" CONCURRENCY="1 8 16" bench/vs_triton.sh
#   ROUNDS=3 bench/vs_triton.sh               # the whole sweep 3 times; median of the ratios
#
# Needs ../shared/bench-peers/setup.sh to have run once (installs real Triton + perf_analyzer
# into $PEERS_DIR, default /tmp/peers). Both servers run at once on loopback; every
# (model, protocol, concurrency) is measured on each back to back, alternating the order, and
# the table prints throughput, p50, p99 and the sluice/Triton ratios. Bounded: each
# perf_analyzer run has a timeout (PA_TIMEOUT, default 120 s) and both servers are stopped by
# PID at the end.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PEERS="${BENCH_PEERS:-$ROOT/../shared/bench-peers}"
PEERS_DIR="${PEERS_DIR:-/tmp/peers}"
if [ ! -f "$PEERS_DIR/env.sh" ]; then
  echo "vs_triton: run $PEERS/setup.sh first (installs Triton 2.51 and perf_analyzer)" >&2
  exit 1
fi
export MODELS="${MODELS:-add_sub}"
export PROTOCOLS="${PROTOCOLS:-grpc http}"
export CONCURRENCY="${CONCURRENCY:-1 2 4 8 16 32}"
SLUICE="$ROOT/.venv/bin/sluice"
CMD="$SLUICE serve --model-repository={repo} --http-address={host} --grpc-address={host} \
--metrics-address={host} --http-port={http_port} --grpc-port={grpc_port} \
--metrics-port={metrics_port}${SLUICE_FLAGS:+ $SLUICE_FLAGS}"
# ROUNDS > 1: the sweep runs that many times (each round on fresh servers, its results in
# folders suffixed _r1, _r2, ...); the table gives the median of the per-round ratios, as a
# single cell moves +-10-20% between runs on a shared machine.
ROUNDS="${ROUNDS:-1}"
SUFFIX="${RESULT_SUFFIX:-}"
rc=0
if [ "$ROUNDS" -le 1 ]; then
  "$PEERS/run.sh" --custom-name sluice --custom-cmd "$CMD" custom triton || rc=$?
else
  for r in $(seq "$ROUNDS"); do
    echo "== round $r of $ROUNDS"
    RESULT_SUFFIX="${SUFFIX}_r$r" "$PEERS/run.sh" --custom-name sluice --custom-cmd "$CMD" \
      custom triton || rc=$?
  done
fi
echo
echo "sluice vs Triton (ratio = sluice / Triton):"
"$ROOT/.venv/bin/python" "$HERE/ratio_table.py" --suffix "$SUFFIX" --rounds "$ROUNDS"
exit $rc
