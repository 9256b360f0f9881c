#!/usr/bin/env bash
# Storage for the one-node lab: a default StorageClass of local volumes (directories under
# WORKDIR/pv/) bound when a pod needs them, COUNT PersistentVolumes offered up front, and a
# recycler that wipes a released volume's directory and offers it again. CloudNativePG asks for
# a PVC per instance; a pool that deletes clusters on release frees one each time.
#
# usage: testkit/k8s/node/storage.sh WORKDIR COUNT     (up.sh runs it; the recycler's PID is
#                                                      WORKDIR/pv-recycler.pid; run it again
#                                                      with a larger COUNT to offer more)
#
# Local volumes rather than hostPath ones: the kubelet applies a pod's fsGroup to a local volume,
# so Postgres (uid/gid 26) can write to a directory that root created.
set -euo pipefail

work=$1
count=$2
netns=$(<"$work/netns")
export KUBECONFIG=$work/kubeconfig
kc() { nsenter --net="/run/netns/$netns" kubectl --request-timeout=10s "$@"; }

mkdir -p "$work/pv"
{
  cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: pgwake-local
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
  for i in $(seq -w 1 "$count"); do
    mkdir -p "$work/pv/pv$i"
    cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pgwake-local-$i
  labels:
    pgwake.io/lab-volume: "true"
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: pgwake-local
  local:
    path: $work/pv/pv$i
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - { key: kubernetes.io/hostname, operator: In, values: [pgwake-node] }
EOF
  done
} | kc apply -f - >/dev/null

# The recycler: every few seconds, each Released volume is emptied and made Available again.
# Run again (to offer more volumes), the script keeps the recycler already there.
if [[ -f $work/pv-recycler.pid ]] && kill -0 "$(<"$work/pv-recycler.pid")" 2>/dev/null; then
  exit 0
fi
setsid bash -c '
  work=$1 netns=$2
  export KUBECONFIG=$work/kubeconfig
  while sleep 3; do
    nsenter --net="/run/netns/$netns" kubectl --request-timeout=10s get pv -l pgwake.io/lab-volume \
      -o jsonpath="{range .items[?(@.status.phase==\"Released\")]}{.metadata.name} {.spec.local.path}{\"\n\"}{end}" \
      2>/dev/null |
      while read -r name path; do
        [[ -n $name && $path == "$work"/pv/* ]] || continue
        find "$path" -mindepth 1 -delete
        nsenter --net="/run/netns/$netns" kubectl --request-timeout=10s patch pv "$name" \
          --type=json -p "[{\"op\":\"remove\",\"path\":\"/spec/claimRef\"}]" >/dev/null 2>&1
      done
  done
' pgwake-node-pv-recycler "$work" "$netns" </dev/null >"$work/logs/pv-recycler.log" 2>&1 &
echo $! >"$work/pv-recycler.pid"
