#!/usr/bin/env bash
# Starts a one-node Kubernetes cluster on this machine: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd (with runc), kubelet and kube-proxy, all inside a network namespace the
# lab creates, with a bridge pod network inside it. Nothing listens outside that namespace and
# nothing is routed out of it: every address the lab uses is either its own loopback or in a
# namespace it made (the node's, and one per pod).
#
# usage: testkit/k8s/node/up.sh [WORKDIR]      (default ${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/node)
#
# Then run commands in the node's network namespace (kubectl, tests, psql to a Service IP) with
#   testkit/k8s/node/exec.sh CMD...
# and stop everything with testkit/k8s/node/down.sh [WORKDIR].
#
# Environment:
#   PGWAKE_NODE_NETNS   name of the network namespace (default pgwake-node)
#   PGWAKE_NODE_PVS     how many local PersistentVolumes to offer (default 48)
#   PGWAKE_K8S_VERSION  Kubernetes version for build.sh (default 1.37.2)
#   PGWAKE_NODE_IMAGES  directory of OCI archives to import (default: images.sh builds them)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/pgwake
work=${1:-${PGWAKE_NODE_WORK:-$cache/node}}
mkdir -p "$work"
work=$(cd "$work" && pwd)
netns=${PGWAKE_NODE_NETNS:-pgwake-node}
version=${PGWAKE_K8S_VERSION:-1.37.2}

# The node's own address (on the namespace's loopback), the pod subnet on the bridge, the
# Service range the apiserver allocates from (see ../up.sh) and the cluster DNS Service's address.
node_ip=10.201.0.1
pod_cidr=10.244.0.0/24
service_cidr=10.0.0.0/24
dns_ip=10.0.0.10
node_name=pgwake-node

if [[ $(id -u) != 0 ]]; then
  echo "node/up.sh: must run as root (containers, network namespaces, cgroups)" >&2
  exit 1
fi
for tool in containerd containerd-shim-runc-v2 runc ctr nsenter ip iptables kubectl; do
  command -v "$tool" >/dev/null || {
    if [[ $tool == kubectl ]]; then
      echo "node/up.sh: kubectl is missing; Debian bookworm has no package for it: install" \
        "the Kubernetes project's release binary (v1.37, or one minor version apart)" >&2
    else
      echo "node/up.sh: $tool is missing; on Debian: apt-get install containerd runc" \
        "containernetworking-plugins iproute2 iptables util-linux" >&2
    fi
    exit 1
  }
done
cni_bin=/usr/lib/cni
[[ -x $cni_bin/bridge ]] || { echo "node/up.sh: no CNI plugins in $cni_bin (apt-get install containernetworking-plugins)" >&2; exit 1; }

bin=$("$here/../build.sh" node "$version" | tail -n 1)
images=${PGWAKE_NODE_IMAGES:-$("$here/images.sh" | tail -n 1)}

if [[ -f $work/netns ]]; then
  echo "node/up.sh: $work is in use (run down.sh $work first)" >&2
  exit 1
fi
mkdir -p "$work/logs" "$work/run"
in_ns() { nsenter --net="/run/netns/$netns" "$@"; }

# --- the node's network namespace --------------------------------------------------------------
ip netns add "$netns"
echo "$netns" >"$work/netns"
in_ns ip link set lo up
# The node's address sits on the namespace's loopback: local to the node, and reachable from
# pods through the bridge, which is their gateway into this namespace.
in_ns ip addr add "$node_ip/32" dev lo
# A connection from the node itself (tests, the apiserver calling a webhook) to a Service address
# needs a route before kube-proxy's DNAT picks the pod; the namespace has no default route.
in_ns ip route add "$service_cidr" dev lo
# Pods reach each other and Services through the node's namespace; the bridge's traffic must pass
# iptables so kube-proxy's rules apply to it too. Both settings are per namespace.
in_ns sysctl -q -w net.ipv4.ip_forward=1
in_ns sysctl -q -w net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
in_ns sysctl -q -w net.ipv4.conf.all.route_localnet=1

# --- etcd and kube-apiserver (the apiserver lab's own script, inside the namespace) -----------
PGWAKE_K8S_BIN=$bin PGWAKE_K8S_NODE_IP=$node_ip in_ns "$here/../up.sh" "$work" 6443 2379 >/dev/null
export KUBECONFIG=$work/kubeconfig
kc() { in_ns kubectl --request-timeout=10s "$@"; }
deadline=$((SECONDS + 120))
until kc get --raw /readyz >/dev/null 2>&1; do
  ((SECONDS < deadline)) || { echo "node/up.sh: kube-apiserver not ready in 120 s" >&2; exit 1; }
  sleep 0.5
done

start() { # NAME COMMAND...: in the namespace, in the background, PID recorded
  local name=$1
  shift
  nsenter --net="/run/netns/$netns" "$@" </dev/null >"$work/logs/$name.log" 2>&1 &
  echo $! >"$work/$name.pid"
}

# --- controller manager and scheduler ------------------------------------------------------------
start controller-manager "$bin/kube-controller-manager" \
  --kubeconfig="$work/kubeconfig" \
  --bind-address=127.0.0.1 \
  --leader-elect=false \
  --service-account-private-key-file="$work/pki/sa.key" \
  --root-ca-file="$work/pki/ca.crt" \
  --service-cluster-ip-range="$service_cidr" \
  --cluster-cidr="$pod_cidr" \
  --use-service-account-credentials=false \
  --controllers='*' \
  --v=1
start scheduler "$bin/kube-scheduler" \
  --kubeconfig="$work/kubeconfig" \
  --bind-address=127.0.0.1 \
  --leader-elect=false \
  --v=1

# --- containerd ------------------------------------------------------------------------------
mkdir -p "$work/cni/net.d" "$work/containerd"
cat >"$work/containerd.toml" <<EOF
version = 2
root = "$work/containerd/root"
state = "$work/containerd/state"
[grpc]
  address = "$work/run/containerd.sock"
[ttrpc]
  address = "$work/run/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  # The lab's own pause image (pause.c), imported below: no registry is ever asked.
  sandbox_image = "pgwake.local/pause:1"
  stream_server_address = "127.0.0.1"
  # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its OOM score below
  # containerd's own (the kubelet asks -998 for sandboxes); runc fails outright if asked to.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$work/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
EOF
# One bridge in the node's namespace; pods get addresses from pod_cidr, their default route is
# the bridge, and nothing is masqueraded because nothing leaves the namespace.
cat >"$work/cni/net.d/10-pgwake.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "pgwake-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$pod_cidr" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "$work/cni/ipam"
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
start containerd containerd --config "$work/containerd.toml"
deadline=$((SECONDS + 60))
until ctr -a "$work/run/containerd.sock" version >/dev/null 2>&1; do
  ((SECONDS < deadline)) || { echo "node/up.sh: containerd did not start (log: $work/logs/containerd.log)" >&2; exit 1; }
  sleep 0.2
done
for archive in "$images"/*.tar; do
  ctr -a "$work/run/containerd.sock" -n k8s.io images import --no-unpack "$archive" >/dev/null
done

# --- kubelet -------------------------------------------------------------------------------------
# Empty: pods get the cluster DNS only, never this machine's resolvers.
: >"$work/resolv.conf"
mkdir -p "$work/kubelet"
cat >"$work/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1, which recent kubelets refuse unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
# The pods' cgroups live under their own root, so down.sh can find and remove them.
cgroupRoot: /pgwake-node
containerRuntimeEndpoint: unix://$work/run/containerd.sock
address: $node_ip
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# The apiserver calls the kubelet (logs, exec) without a client certificate; only the node's own
# namespace can reach this port, so anyone who can is allowed.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDomain: cluster.local
clusterDNS: [$dns_ip]
resolvConf: $work/resolv.conf
failSwapOn: false
# A lab on a shared disk: never evict pods or collect images because the disk is busy.
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# Status is reported every second so waits in tests end soon after the fact.
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
maxPods: 60
EOF
# The kubelet's cgroupRoot must exist in every hierarchy it uses (cgroup v1 here); a new cpuset
# cgroup has no CPUs or memory nodes until given its parent's.
for hierarchy in /sys/fs/cgroup/*/; do
  [[ -f ${hierarchy}cgroup.procs ]] || continue
  mkdir -p "${hierarchy}pgwake-node"
  if [[ -f ${hierarchy}cpuset.cpus ]]; then
    cat "${hierarchy}cpuset.cpus" >"${hierarchy}pgwake-node/cpuset.cpus"
    cat "${hierarchy}cpuset.mems" >"${hierarchy}pgwake-node/cpuset.mems"
  fi
done
start kubelet "$bin/kubelet" \
  --config="$work/kubelet.yaml" \
  --kubeconfig="$work/kubeconfig" \
  --root-dir="$work/kubelet" \
  --cert-dir="$work/kubelet/pki" \
  --hostname-override="$node_name" \
  --node-ip="$node_ip" \
  --v=1

# --- kube-proxy ----------------------------------------------------------------------------------
cat >"$work/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $pod_cidr
hostnameOverride: $node_name
bindAddress: $node_ip
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
clientConnection:
  kubeconfig: $work/kubeconfig
# Leave the kernel's conntrack limits alone: they are not per namespace.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
start kube-proxy "$bin/kube-proxy" --config="$work/kube-proxy.yaml" --v=1

# --- wait for the node ---------------------------------------------------------------------------
deadline=$((SECONDS + 180))
until [[ $(kc get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]; do
  for p in controller-manager scheduler containerd kubelet kube-proxy; do
    if ! kill -0 "$(<"$work/$p.pid")" 2>/dev/null; then
      echo "node/up.sh: $p exited; last lines of $work/logs/$p.log:" >&2
      tail -n 20 "$work/logs/$p.log" >&2
      exit 1
    fi
  done
  ((SECONDS < deadline)) || { echo "node/up.sh: node not Ready in 180 s (logs in $work/logs)" >&2; exit 1; }
  sleep 1
done

# --- storage ---------------------------------------------------------------------------------------
"$here/storage.sh" "$work" "${PGWAKE_NODE_PVS:-48}"

# --- cluster DNS ----------------------------------------------------------------------------------
kc apply -f - >/dev/null <<EOF
$(sed "s/@DNS_IP@/$dns_ip/" "$here/coredns.yaml")
EOF

echo "node=$node_name netns=$netns kubeconfig=$work/kubeconfig work=$work"
