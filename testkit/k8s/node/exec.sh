#!/usr/bin/env bash
# Runs a command in the one-node lab's network namespace, where its apiserver (127.0.0.1:6443),
# Service addresses and pod addresses are reachable, with KUBECONFIG pointing at the lab.
#
# usage: testkit/k8s/node/exec.sh CMD [ARG...]
#        e.g. testkit/k8s/node/exec.sh kubectl get pods -A
# Environment: PGWAKE_NODE_WORK (default ${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/node)
set -euo pipefail
work=${PGWAKE_NODE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/node}
if [[ ! -f $work/netns ]]; then
  echo "exec.sh: no lab running in $work (testkit/k8s/node/up.sh starts one)" >&2
  exit 1
fi
export KUBECONFIG=${KUBECONFIG:-$work/kubeconfig}
export PGWAKE_NODE_WORK=$work
# The namespace reaches only the lab: crates a test needs (the test-only ones too, which a
# release build never fetched) are fetched here first, where the registry is reachable.
if [[ ${1:-} == cargo ]]; then
  cargo fetch --locked >&2
fi
exec nsenter --net="/run/netns/$(<"$work/netns")" "$@"
