#!/bin/bash
# Two simulated hosts on this machine (bench/RESULTS.md, "Automatic planning", topology): network namespaces
# dth0 and dth1, joined by a veth pair whose two ends a token-bucket qdisc (tc tbf) slows to RATE. Ranks in
# one namespace talk over its own stack (unthrottled); ranks in different ones over the slowed link. Root only.
#   bash bench/topology_netns.sh up [RATE]   (RATE: tc's syntax, e.g. 1760mbit; default: loopback's / 20)
#   bash bench/topology_netns.sh down
#   bash bench/topology_netns.sh bandwidth   (one TCP stream's MB/s: loopback, and across the link)
set -euo pipefail
tcp_mb_s() {  # MB/s of one TCP stream: tcp_mb_s SERVER_NS CLIENT_NS ADDRESS
  python3 - "$1" "$2" "$3" <<'PY'
import socket, subprocess, sys, time
server_ns, client_ns, addr = sys.argv[1:4]
N = 256 << 20
sink = ("import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('0.0.0.0',39111));s.listen(1);print('up',flush=True);c,_=s.accept()\n"
        "while c.recv(1<<20): pass\n")
srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "python3", "-c", sink], stdout=subprocess.PIPE, text=True)
srv.stdout.readline()
client = ("import socket,time,sys\nc=socket.create_connection((sys.argv[1],39111));b=b'x'*(1<<20);t=time.time()\n"
          f"for _ in range({N >> 20}): c.sendall(b)\n"
          "c.shutdown(socket.SHUT_WR);c.recv(1);print(time.time()-t)\n")
dt = float(subprocess.check_output(["ip", "netns", "exec", client_ns, "python3", "-c", client, addr], text=True))
srv.wait()
print(f"{N / dt / 1e6:.0f}")
PY
}
case "${1:-}" in
  up)
    ip netns add dth0
    ip netns add dth1
    ip link add dtv0 type veth peer name dtv1
    ip link set dtv0 netns dth0
    ip link set dtv1 netns dth1
    ip -n dth0 addr add 10.77.0.1/24 dev dtv0
    ip -n dth1 addr add 10.77.0.2/24 dev dtv1
    for n in 0 1; do
      ip -n dth$n link set lo up
      ip -n dth$n link set dtv$n up
    done
    rate="${2:-}"
    if [[ -z "$rate" ]]; then
      lo=$(tcp_mb_s dth0 dth0 127.0.0.1)
      rate="$((lo * 8 / 20))mbit"
      echo "loopback: $lo MB/s in one TCP stream; the link between the hosts: $rate (1/20)"
    fi
    for n in 0 1; do  # (burst: one 64 KiB segment; a larger bucket lets short bursts, e.g. tp's collectives, pass unslowed)
      tc -n dth$n qdisc add dev dtv$n root tbf rate "$rate" burst 64kb latency 50ms
    done
    ;;
  down)
    ip netns del dth0 2>/dev/null || true
    ip netns del dth1 2>/dev/null || true
    ;;
  bandwidth)
    echo "loopback (inside dth0): $(tcp_mb_s dth0 dth0 127.0.0.1) MB/s"
    echo "inside dth0 by its link's address: $(tcp_mb_s dth0 dth0 10.77.0.1) MB/s"
    echo "dth1 -> dth0 across the link: $(tcp_mb_s dth0 dth1 10.77.0.1) MB/s"
    ;;
  *)
    echo "usage: $0 up [RATE] | down | bandwidth" >&2
    exit 2
    ;;
esac
