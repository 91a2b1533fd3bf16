#!/bin/bash
# Runs one dtrain command as a job of 4 ranks on the two simulated hosts of bench/topology_netns.sh (2 ranks
# each, one launcher per host, Gloo), and prints host 0's output (rank 0's lines). Host 1's goes to
# $TOPO_OUT/host1.log.   bash bench/topology_run.sh train --steps 40 ...
set -euo pipefail
dtrain_bin="${DTRAIN:-$(command -v dtrain)}"
out="${TOPO_OUT:-/tmp/dtrain-topology}"
mkdir -p "$out"
port=$((29100 + RANDOM % 800))
# the job's secret, shared by the two launchers (each would otherwise make its own)
secret="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
common=(-n 2 --nnodes 2 --master-addr 10.77.0.1 --master-port "$port" --backend gloo)
ip netns exec dth1 env DTRAIN_JOB_SECRET="$secret" GLOO_SOCKET_IFNAME=dtv1 OMP_NUM_THREADS=1 \
  "$dtrain_bin" run "${common[@]}" --node-rank 1 -- "$dtrain_bin" "$@" >"$out/host1.log" 2>&1 &
other=$!
rc=0
ip netns exec dth0 env DTRAIN_JOB_SECRET="$secret" GLOO_SOCKET_IFNAME=dtv0 OMP_NUM_THREADS=1 \
  "$dtrain_bin" run "${common[@]}" --node-rank 0 -- "$dtrain_bin" "$@" 2>&1 | tee "$out/host0.log" || rc=$?
wait "$other" || rc=$?
exit "$rc"
