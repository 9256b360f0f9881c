#!/usr/bin/env bash
# Installs the CloudNativePG operator into the one-node lab from the release manifest its own Go
# module ships (releases/cnpg-<version>.yaml), as a user would, changed only where the lab has
# to: the operator image is the one images.sh built (never pulled: no registry is reachable),
# and new clusters default to the lab's Debian-built Postgres image. Waits until the operator's
# webhooks answer, so Clusters can be created right after.
#
# usage: testkit/k8s/node/cnpg.sh [WORKDIR]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=${1:-${PGWAKE_NODE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/node}}
version=1.28.1
pg_image=pgwake.local/postgresql:15.18
export PGWAKE_NODE_WORK=$work
kc() { "$here/exec.sh" kubectl --request-timeout=30s "$@"; }

export GOTOOLCHAIN=local GOFLAGS="-modcacherw ${GOFLAGS:-}"
go=${PGWAKE_GO:-$(command -v go || echo /usr/local/go/bin/go)}
src=$(cd /tmp && "$go" mod download -json "github.com/cloudnative-pg/cloudnative-pg@v$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
manifest=$src/releases/cnpg-$version.yaml
[[ -f $manifest ]] || { echo "cnpg.sh: no $manifest" >&2; exit 1; }

kc create namespace cnpg-system --dry-run=client -o yaml | kc apply -f - >/dev/null
# The operator reads its defaults from this ConfigMap at start.
kc -n cnpg-system create configmap cnpg-controller-manager-config \
  --from-literal=POSTGRES_IMAGE_NAME="$pg_image" --dry-run=client -o yaml | kc apply -f - >/dev/null
# Server-side: the CRDs are too large for the last-applied annotation.
sed -e "s#ghcr.io/cloudnative-pg/cloudnative-pg:$version#pgwake.local/cloudnative-pg:$version#g" \
  -e 's#imagePullPolicy: Always#imagePullPolicy: Never#' "$manifest" |
  kc apply --server-side --force-conflicts -f - >/dev/null
kc -n cnpg-system rollout status deployment/cnpg-controller-manager --timeout=180s >/dev/null
# Ready means the webhook server listens; the apiserver also needs the Service's endpoints and
# the CA the operator patches into its webhook configurations. A dry-run Cluster goes through
# both webhooks.
deadline=$((SECONDS + 120))
until kc apply --dry-run=server -f - >/dev/null 2>&1 <<EOF; do
apiVersion: postgresql.cnpg.io/v1
kind: Cluster
metadata:
  name: webhook-probe
  namespace: default
spec:
  instances: 1
  storage:
    size: 1Gi
EOF
  ((SECONDS < deadline)) || { echo "cnpg.sh: the operator's webhooks do not answer" >&2; exit 1; }
  sleep 1
done
echo "cloudnative-pg $version running (image pgwake.local/cloudnative-pg:$version, Postgres $pg_image)"
