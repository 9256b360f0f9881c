#!/usr/bin/env bash
# Applies deploy/ to the one-node lab as a user would: an overlay that only names the lab's
# image (this checkout's gateway, imported by up.sh) and, for tests, a shorter idle timeout; a
# TLS Secret made here; then waits for the gateway's rollout.
#
# usage: testkit/k8s/node/deploy.sh [WORKDIR] KUSTOMIZATION...
#   KUSTOMIZATION is a directory under deploy/: base, examples/cnpg, examples/pool,
#   examples/sidecar. With base or examples/pool, the gateway Deployment is waited for.
#
# Environment:
#   PGWAKE_NODE_IDLE_TIMEOUT   replaces wake.idle_timeout in the gateway's pgwake.toml (e.g. 20s)
#   PGWAKE_NODE_ROUTE          with PGWAKE_NODE_IDLE_TIMEOUT: sets [kubernetes] route (primary_pod,
#                              service) for a side-by-side measurement
#   PGWAKE_NODE_PEER=1         enables cancel forwarding between the gateway's replicas the way
#                              deploy/README.md describes (port, environment, token Secret)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=${PGWAKE_NODE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/node}
if [[ $# -gt 0 && -d $1 && ! -d $repo/deploy/$1 ]]; then
  work=$1
  shift
fi
export PGWAKE_NODE_WORK=$work
kc() { "$here/exec.sh" kubectl --request-timeout=30s "$@"; }
kustomize=$("$here/../build.sh" kustomize | tail -n 1)

for ns in pgwake pool shop; do
  kc create namespace "$ns" --dry-run=client -o yaml | kc apply -f - >/dev/null
done
if ! kc -n pgwake get secret pgwake-tls >/dev/null 2>&1; then
  tls=$(mktemp -d)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=*.db.example.com" -addext "subjectAltName=DNS:*.db.example.com" \
    -keyout "$tls/tls.key" -out "$tls/tls.crt" 2>/dev/null
  kc -n pgwake create secret tls pgwake-tls --cert="$tls/tls.crt" --key="$tls/tls.key" >/dev/null
  rm -rf "$tls"
fi

if [[ ${PGWAKE_NODE_PEER:-0} == 1 ]] && ! kc -n pgwake get secret pgwake-peer-token >/dev/null 2>&1; then
  kc -n pgwake create secret generic pgwake-peer-token \
    --from-literal=token="$(openssl rand -hex 32)" >/dev/null
fi

for kustomization in "$@"; do
  src=$repo/deploy/$kustomization
  [[ -f $src/kustomization.yaml ]] || { echo "deploy.sh: no deploy/$kustomization" >&2; exit 2; }
  overlay=$work/deploy/${kustomization//\//-}
  rm -rf "$overlay"
  mkdir -p "$overlay"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "  - $(realpath --relative-to="$overlay" "$src")"
    echo "images:"
    echo "  - name: pgwake"
    echo "    newName: pgwake.local/pgwake"
    echo "    newTag: dev"
    if [[ $kustomization == examples/sidecar ]]; then
      # The example's application image is a placeholder; in the lab the application is psql
      # (from the lab's Postgres image), idle until a test runs it with kubectl exec.
      echo "  - name: registry.example.com/shop"
      echo "    newName: pgwake.local/postgresql"
      echo "    newTag: \"15.18\""
      echo "patches:"
      echo "  - target: { kind: Deployment, name: shop }"
      echo "    patch: |-"
      echo "      - op: add"
      echo "        path: /spec/template/spec/containers/0/command"
      echo "        value: [sleep, infinity]"
    fi
    if [[ ${PGWAKE_NODE_PEER:-0} == 1 && ($kustomization == base || $kustomization == examples/pool) ]]; then
      # Cancels across replicas, enabled as deploy/README.md says: a port named peer on the
      # container and the Service, the listener and [peer] by environment, the pod's address
      # from the downward API, and the shared token from a Secret.
      echo "patches:"
      echo "  - target: { kind: Deployment, name: pgwake }"
      echo "    patch: |-"
      echo "      - op: add"
      echo "        path: /spec/template/spec/containers/0/ports/-"
      echo "        value: { name: peer, containerPort: 6433 }"
      echo "      - op: add"
      echo "        path: /spec/template/spec/containers/0/env/-"
      echo "        value: { name: POD_IP, valueFrom: { fieldRef: { fieldPath: status.podIP } } }"
      for kv in PGWAKE_LISTEN__PEER=0.0.0.0:6433 PGWAKE_PEER__SERVICE=pgwake \
        'PGWAKE_PEER__ADVERTISE=$(POD_IP):6433' PGWAKE_PEER__TOKEN_FILE=/etc/pgwake/peer/token; do
        echo "      - op: add"
        echo "        path: /spec/template/spec/containers/0/env/-"
        echo "        value: { name: ${kv%%=*}, value: \"${kv#*=}\" }"
      done
      echo "      - op: add"
      echo "        path: /spec/template/spec/containers/0/volumeMounts/-"
      echo "        value: { name: peer-token, mountPath: /etc/pgwake/peer, readOnly: true }"
      echo "      - op: add"
      echo "        path: /spec/template/spec/volumes/-"
      echo "        value: { name: peer-token, secret: { secretName: pgwake-peer-token } }"
      echo "  - target: { kind: Service, name: pgwake }"
      echo "    patch: |-"
      echo "      - op: add"
      echo "        path: /spec/ports/-"
      echo "        value: { name: peer, port: 6433, targetPort: peer }"
    fi
  } >"$overlay/kustomization.yaml"
  # The gateway's own config, with the lab's idle timeout, replaces the ConfigMap's file.
  if [[ -n ${PGWAKE_NODE_IDLE_TIMEOUT:-} ]]; then
    for config in "$src"/pgwake.toml; do
      [[ -f $config ]] || continue
      sed "s/^idle_timeout = .*/idle_timeout = \"$PGWAKE_NODE_IDLE_TIMEOUT\"/" "$config" >"$overlay/pgwake.toml"
      if [[ -n ${PGWAKE_NODE_ROUTE:-} ]]; then
        if grep -q '^\[kubernetes\]' "$overlay/pgwake.toml"; then
          sed -i "/^\[kubernetes\]/a route = \"$PGWAKE_NODE_ROUTE\"" "$overlay/pgwake.toml"
        else
          printf '\n[kubernetes]\nroute = "%s"\n' "$PGWAKE_NODE_ROUTE" >>"$overlay/pgwake.toml"
        fi
      fi
      name=pgwake-config
      ns=pgwake
      [[ $kustomization == examples/sidecar ]] && { name=pgwake-sidecar; ns=shop; }
      files="      - pgwake.toml"
      if [[ -f $src/small-cluster.yaml ]]; then
        cp "$src/small-cluster.yaml" "$overlay/"
        files+=$'\n'"      - small-cluster.yaml"
      fi
      cat >>"$overlay/kustomization.yaml" <<EOF
configMapGenerator:
  - name: $name
    namespace: $ns
    behavior: replace
    files:
$files
EOF
    done
  fi
  "$kustomize" build "$overlay" >"$overlay/rendered.yaml"
  # A Cluster that exists keeps the hibernation state the gateway gave it: the examples create
  # clusters asleep, and applying their "on" again with --force-conflicts would stop a cluster
  # the gateway is serving.
  kc get clusters.postgresql.cnpg.io -A -o json 2>/dev/null >"$overlay/live.json" || echo '{"items":[]}' >"$overlay/live.json"
  python3 - "$overlay/rendered.yaml" "$overlay/live.json" <<'PY'
import json, re, sys
rendered, live = sys.argv[1], json.load(open(sys.argv[2]))
state = {(c["metadata"]["namespace"], c["metadata"]["name"]):
         c["metadata"].get("annotations", {}).get("cnpg.io/hibernation") for c in live["items"]}
docs = open(rendered).read().split("\n---\n")
for i, doc in enumerate(docs):
    if not re.search(r"^kind: Cluster$", doc, re.M):
        continue
    name = re.search(r"^  name: (\S+)$", doc, re.M)
    ns = re.search(r"^  namespace: (\S+)$", doc, re.M)
    value = state.get((ns and ns.group(1), name and name.group(1)))
    if value:
        docs[i] = re.sub(r'(cnpg\.io/hibernation: )"?\w+"?', r'\g<1>"%s"' % value, doc)
open(rendered, "w").write("\n---\n".join(docs))
PY
  kc apply --server-side --force-conflicts -f "$overlay/rendered.yaml" >/dev/null
  if [[ $kustomization == base || $kustomization == examples/pool ]]; then
    kc -n pgwake rollout status deployment/pgwake --timeout=180s >/dev/null
    # Replaced replicas keep serving through their preStop pause, with the previous config (the
    # pool example names a tenant alpha too): wait until they are gone.
    deadline=$((SECONDS + 120))
    want=$(kc -n pgwake get deployment pgwake -o jsonpath='{.spec.replicas}')
    while (($(kc -n pgwake get pods -l app.kubernetes.io/name=pgwake,app.kubernetes.io/component=gateway --no-headers | wc -l) > want)); do
      ((SECONDS < deadline)) || { echo "deploy.sh: old gateway pods still running" >&2; exit 1; }
      sleep 1
    done
  fi
  echo "deploy/$kustomization applied"
done
