#!/usr/bin/env bash
# Stops the one-node lab that up.sh started in WORKDIR and removes what it made: its pods (so the
# container runtime tears their networks down), then kube-proxy, the controllers, the kubelet,
# containerd and what runc left behind, the apiserver and etcd, the mounts under WORKDIR, the
# pods' cgroups and the node's network namespace. Every process is found by a PID that up.sh
# recorded, or (for container shims, which containerd starts detached) by this WORKDIR's own
# containerd socket in its command line. Images stay in WORKDIR/containerd for the next run.
#
# usage: testkit/k8s/node/down.sh [WORKDIR]
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=${1:-${PGWAKE_NODE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/node}}
[[ -d $work ]] || exit 0
work=$(cd "$work" && pwd)
netns=$(cat "$work/netns" 2>/dev/null || true)
sock=$work/run/containerd.sock
export KUBECONFIG=$work/kubeconfig
in_ns() { if [[ -n $netns ]]; then nsenter --net="/run/netns/$netns" "$@"; else "$@"; fi; }

# stop NAME EXPECTED: as ../down.sh does, TERM then KILL, after checking the command line.
stop() {
  local file=$work/$1.pid expected=$2 pid
  [[ -f $file ]] || return 0
  pid=$(<"$file")
  if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$expected"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$file"
}

stop pv-recycler pgwake-node-pv-recycler
# Nothing may recreate pods while they go.
stop controller-manager kube-controller-manager
stop scheduler kube-scheduler
stop kube-proxy kube-proxy

# Pods deleted at once; the kubelet kills their containers and stops their sandboxes, which
# releases their addresses and removes their network namespaces.
if [[ -f $work/kubelet.pid ]] && in_ns kubectl --request-timeout=5s get --raw /readyz >/dev/null 2>&1; then
  in_ns kubectl --request-timeout=20s delete pods --all --all-namespaces --grace-period=0 --force \
    --wait=false >/dev/null 2>&1
  for _ in $(seq 60); do
    [[ -z $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null) ]] && break
    sleep 0.5
  done
  # The sandboxes go a moment after their containers.
  sleep 2
fi
stop kubelet kubelet

# Whatever is left: killed and deleted through containerd, then containerd itself.
if [[ -S $sock ]]; then
  for task in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io tasks kill -s KILL "$task" >/dev/null 2>&1
  done
  sleep 1
  for task in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io tasks delete -f "$task" >/dev/null 2>&1
  done
  for c in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
    ctr -a "$sock" -n k8s.io containers delete "$c" >/dev/null 2>&1
  done
fi
stop containerd containerd
# Shims this containerd started: their command line names its socket.
for pid in $(pgrep -f -- "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do
  kill -KILL "$pid" 2>/dev/null
done

"$here/../down.sh" "$work"

# Mounts under WORKDIR (volumes, container root filesystems, sandbox shm), deepest first.
awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r |
  while read -r m; do umount -l "$m" 2>/dev/null; done

# The pods' cgroups (kubelet's cgroupRoot), leaves first.
for hierarchy in /sys/fs/cgroup/*/; do
  [[ -d ${hierarchy}pgwake-node ]] || continue
  find "${hierarchy}pgwake-node" -depth -type d -exec rmdir {} + 2>/dev/null
done

if [[ -n $netns ]]; then
  ip netns delete "$netns" 2>/dev/null
fi
# The next up.sh starts from an empty cluster; images and logs stay.
rm -rf "$work/etcd" "$work/kubelet" "$work/pv" "$work/cni" "$work/run" "$work/apiserver-certs" \
  "$work/containerd/state" "$work/netns"
exit 0
