#!/usr/bin/env bash
# Starts a throwaway Kubernetes control plane (etcd + kube-apiserver) on 127.0.0.1.
#
# usage: testkit/k8s/up.sh WORKDIR API_PORT ETCD_PORT [ETCD_PEER_PORT]
#
# WORKDIR gets:      pki/ (CA, serving cert, service-account key pair), tokens.csv,
#                    admin.token, gateway.token, kubeconfig (contexts `admin`, `gateway`),
#                    etcd.pid, apiserver.pid, logs/{etcd,apiserver}.log
# Static identities: admin         -> user pgwake-admin in group system:masters (bypasses RBAC)
#                    gateway token -> user pgwake-gateway, no groups (RBAC decides everything)
# ServiceAccount tokens come from the TokenRequest API
# (POST /api/v1/namespaces/NS/serviceaccounts/NAME/token), signed with pki/sa.key.
#
# Returns once both servers accept TCP connections; poll https://127.0.0.1:API_PORT/readyz
# (trusting WORKDIR/pki/ca.crt) before relying on the API. Stop everything with down.sh WORKDIR.
#
# Environment:
#   PGWAKE_K8S_BIN           directory holding etcd and kube-apiserver (default: build.sh's)
#   PGWAKE_K8S_VERSION       version for build.sh when PGWAKE_K8S_BIN is unset
#   PGWAKE_K8S_WATCHDOG      a PID; when it exits, a detached watchdog runs down.sh WORKDIR, so a
#                            test process that dies without cleaning up leaves no servers behind
#   PGWAKE_K8S_WATCHDOG_RMDIR=1  the watchdog also deletes WORKDIR afterwards
#   PGWAKE_K8S_NODE_IP       for the one-node lab (testkit/k8s/node/up.sh, which runs this script
#                            inside the lab's own network namespace): kube-apiserver listens on
#                            every address of that namespace, publishes this one as the endpoint
#                            of the `kubernetes` Service so pods reach it, and keeps the
#                            ServiceAccount admission plugin (a controller manager runs there)
#   PGWAKE_K8S_APISERVER_ONLY=1  (re)start only kube-apiserver in an existing WORKDIR whose etcd
#                            still runs: tests stop and restart the API server to see how the
#                            gateway rides out an outage
set -euo pipefail

if [[ $# -lt 3 ]]; then
  echo "usage: $0 WORKDIR API_PORT ETCD_PORT [ETCD_PEER_PORT]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
work=$(cd "$1" && pwd)
api_port=$2
etcd_port=$3
peer_port=${4:-$((etcd_port + 1))}

bin=${PGWAKE_K8S_BIN:-}
if [[ -z $bin ]]; then
  bin=$("$here/build.sh" "${PGWAKE_K8S_VERSION:-1.37.2}" | tail -n 1)
fi
for b in etcd kube-apiserver; do
  [[ -x $bin/$b ]] || { echo "up.sh: $bin/$b is missing (run build.sh)" >&2; exit 1; }
done
command -v openssl >/dev/null || { echo "up.sh: openssl is needed for the lab's PKI" >&2; exit 1; }

pki=$work/pki
mkdir -p "$pki" "$work/logs"

# --- PKI -------------------------------------------------------------------------------------
# ECDSA P-256 throughout: key generation is instant, where RSA takes seconds on a loaded machine.
# kube-apiserver accepts EC keys for serving and for signing service-account tokens (ES256).
new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [[ ! -f $pki/ca.crt ]]; then
  new_key "$pki/ca.key"
  openssl req -x509 -new -key "$pki/ca.key" -out "$pki/ca.crt" -days 3650 -sha256 \
    -subj "/CN=pgwake-test-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

  # Serving certificate: 127.0.0.1 for tests on this machine; the in-cluster names and the first
  # service IP so the same certificate is valid if a client resolves the `kubernetes` Service.
  new_key "$pki/apiserver.key"
  openssl req -new -key "$pki/apiserver.key" -subj "/CN=kube-apiserver" \
    -out "$pki/apiserver.csr" 2>/dev/null
  cat >"$pki/apiserver.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1${PGWAKE_K8S_NODE_IP:+,IP:$PGWAKE_K8S_NODE_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EXT
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$pki/apiserver.ext" \
    -out "$pki/apiserver.crt" 2>/dev/null

  # Service-account token signing key pair (the apiserver signs with .key, verifies with .pub).
  new_key "$pki/sa.key"
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi

# --- static tokens ---------------------------------------------------------------------------
# Random per lab, so a token seen in one test run means nothing in another.
if [[ ! -f $work/tokens.csv ]]; then
  openssl rand -hex 24 >"$work/admin.token"
  openssl rand -hex 24 >"$work/gateway.token"
  # token,user,uid,"groups"
  {
    echo "$(cat "$work/admin.token"),pgwake-admin,pgwake-admin,\"system:masters\""
    echo "$(cat "$work/gateway.token"),pgwake-gateway,pgwake-gateway"
  } >"$work/tokens.csv"
  chmod 600 "$work/tokens.csv" "$work/admin.token" "$work/gateway.token"
fi

wait_tcp() { # PORT PID NAME LOG: until the port accepts a connection, or the process dies
  local deadline=$((SECONDS + 120))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    if ! kill -0 "$2" 2>/dev/null; then
      echo "up.sh: $3 exited during start-up; last log lines ($4):" >&2
      tail -n 30 "$4" >&2
      exit 1
    fi
    if ((SECONDS > deadline)); then
      echo "up.sh: $3 did not listen on 127.0.0.1:$1 within 120 s (log: $4)" >&2
      exit 1
    fi
    sleep 0.05
  done
}

if [[ ${PGWAKE_K8S_APISERVER_ONLY:-0} != 1 ]]; then
# --- etcd ------------------------------------------------------------------------------------
# Every background process gets its own stdin/stdout/stderr so that a caller reading up.sh's
# output through a pipe sees EOF as soon as this script exits.
# --unsafe-no-fsync: the data is thrown away after the test; fsync would only cost time.
"$bin/etcd" --name pgwake-lab --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "pgwake-lab=http://127.0.0.1:$peer_port" \
  --unsafe-no-fsync --log-level warn \
  </dev/null >"$work/logs/etcd.log" 2>&1 &
etcd_pid=$!
echo "$etcd_pid" >"$work/etcd.pid"

# --- watchdog --------------------------------------------------------------------------------
# Started right after the first server, so even a failure below is cleaned up when the owner
# exits. setsid detaches it from the owner's process group and terminal signals.
if [[ -n ${PGWAKE_K8S_WATCHDOG:-} ]]; then
  rmdir_after=${PGWAKE_K8S_WATCHDOG_RMDIR:-0}
  setsid bash -c '
    owner=$1 work=$2 down=$3 rmdir_after=$4
    cd /
    while kill -0 "$owner" 2>/dev/null; do sleep 1; done
    rm -f "$work/watchdog.pid"
    "$down" "$work"
    if [[ $rmdir_after == 1 ]]; then rm -rf "$work"; fi
  ' pgwake-k8s-watchdog "$PGWAKE_K8S_WATCHDOG" "$work" "$here/down.sh" "$rmdir_after" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$work/watchdog.pid"
fi

wait_tcp "$etcd_port" "$etcd_pid" etcd "$work/logs/etcd.log"
fi

# --- kube-apiserver --------------------------------------------------------------------------
issuer=https://kubernetes.default.svc.cluster.local
args=(
  --etcd-servers="http://127.0.0.1:$etcd_port"
  --bind-address=127.0.0.1
  --secure-port="$api_port"
  # With an advertise address the default "lease" reconciler would try to publish it as the
  # `kubernetes` Service endpoint; loopback is rejected there, so skip reconciliation entirely.
  --advertise-address=127.0.0.1
  --endpoint-reconciler-type=none
  --service-cluster-ip-range=10.0.0.0/24
  # Keep generated files in the work dir instead of /var/run/kubernetes.
  --cert-dir="$work/apiserver-certs"
  --tls-cert-file="$pki/apiserver.crt"
  --tls-private-key-file="$pki/apiserver.key"
  --token-auth-file="$work/tokens.csv"
  --authorization-mode=RBAC
  # TokenRequest needs an issuer, a signing key and a key to verify with; tokens requested
  # without explicit audiences are issued for --api-audiences.
  --service-account-issuer="$issuer"
  --service-account-signing-key-file="$pki/sa.key"
  --service-account-key-file="$pki/sa.pub"
  --api-audiences="$issuer"
  --profiling=false
  --v=1
)
if [[ -n ${PGWAKE_K8S_NODE_IP:-} ]]; then
  # Later flags win: the whole namespace is the lab's, and its pods need the API at the node IP.
  args+=(
    --bind-address=0.0.0.0
    --advertise-address="$PGWAKE_K8S_NODE_IP"
    --endpoint-reconciler-type=lease
    # The node has no name in any DNS; the apiserver reaches its kubelet by address.
    --kubelet-preferred-address-types=InternalIP
  )
else
  # Without a controller manager nobody creates the `default` ServiceAccount, so this admission
  # plugin would reject every Pod; tests that create Pods as plain objects need it off.
  args+=(--disable-admission-plugins=ServiceAccount)
fi
"$bin/kube-apiserver" "${args[@]}" </dev/null >"$work/logs/apiserver.log" 2>&1 &
api_pid=$!
echo "$api_pid" >"$work/apiserver.pid"
wait_tcp "$api_port" "$api_pid" kube-apiserver "$work/logs/apiserver.log"

# --- kubeconfig ------------------------------------------------------------------------------
ca_data=$(base64 -w0 <"$pki/ca.crt")
umask 077
cat >"$work/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: pgwake-lab
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $ca_data
users:
- name: admin
  user:
    token: $(cat "$work/admin.token")
- name: gateway
  user:
    token: $(cat "$work/gateway.token")
contexts:
- name: admin
  context:
    cluster: pgwake-lab
    user: admin
    namespace: default
- name: gateway
  context:
    cluster: pgwake-lab
    user: gateway
    namespace: default
current-context: admin
KUBECONFIG

echo "api=https://127.0.0.1:$api_port etcd_pid=$(cat "$work/etcd.pid") apiserver_pid=$api_pid kubeconfig=$work/kubeconfig"
