#!/usr/bin/env bash
# Builds kube-apiserver and etcd for the Kubernetes test lab, from the Go module proxy alone.
#
# usage: testkit/k8s/build.sh [KUBERNETES_VERSION]        (default 1.37.2)
#        testkit/k8s/build.sh node [KUBERNETES_VERSION]   (also the node: kubelet, scheduler, ...)
#        testkit/k8s/build.sh kustomize [KUSTOMIZE_VERSION] (default 5.8.2)
#        testkit/k8s/build.sh cnpg-crd [CLOUDNATIVEPG_VERSION] (default 1.28.1)
#
# The binaries land in ${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/<version>/bin/ and the script
# returns at once when both are already there: a cold kube-apiserver build costs 10-18 minutes on
# two cores, so only the first run on a machine should pay for it. The last line printed is the
# binary directory, so callers can capture it.
#
# With `kustomize`, it builds kustomize (which renders deploy/) into
# ${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/kustomize-<version>/ instead (about a minute cold)
# and prints the path of the binary last.
#
# With `cnpg-crd`, it fetches the CloudNativePG `Cluster` CRD from the
# github.com/cloudnative-pg/cloudnative-pg Go module, exactly as that operator release ships it,
# into ${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/cnpg-<version>/ (a few seconds: one module
# download, nothing built) and prints the path of the YAML file last.
#
# Environment: PGWAKE_GO (path of the go command; else `go` on PATH, else /usr/local/go/bin/go).
set -euo pipefail

find_go() {
  go=${PGWAKE_GO:-}
  if [[ -z $go ]]; then
    go=$(command -v go || true)
    [[ -n $go ]] || go=/usr/local/go/bin/go
  fi
  if [[ ! -x $go ]]; then
    echo "build.sh: no Go toolchain (looked for \$PGWAKE_GO, go on PATH, /usr/local/go/bin/go);" \
      "it is needed once to build $1" >&2
    exit 127
  fi
}

# Never let `go` fetch a newer toolchain: if the local one is too old we want a clear error.
export GOTOOLCHAIN=local
# Lets `rm -rf` clean the module cache without a chmod first.
export GOFLAGS="-modcacherw ${GOFLAGS:-}"
run_go() { nice -n 19 "$go" "$@"; }

if [[ ${1:-} == kustomize ]]; then
  kversion=${2:-5.8.2}
  if [[ ! $kversion =~ ^5\.[0-9]+\.[0-9]+$ ]]; then
    echo "build.sh: kustomize version must look like 5.8.2, got '$kversion'" >&2
    exit 2
  fi
  kdir=${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/kustomize-$kversion
  if [[ ! -x $kdir/kustomize ]]; then
    find_go "kustomize into $kdir"
    mkdir -p "$kdir"
    exec 9>"$kdir/build.lock"
    flock 9
    if [[ ! -x $kdir/kustomize ]]; then
      # `go install pkg@version` builds outside any module, exactly the published release.
      GOBIN=$kdir/.partial run_go install -trimpath -ldflags "-s -w" \
        "sigs.k8s.io/kustomize/kustomize/v5@v$kversion"
      mv -f "$kdir/.partial/kustomize" "$kdir/kustomize"
      rmdir "$kdir/.partial"
      echo "build.sh: kustomize v$kversion built" >&2
    fi
  fi
  echo "$kdir/kustomize"
  exit 0
fi

if [[ ${1:-} == cnpg-crd ]]; then
  cversion=${2:-1.28.1}
  if [[ ! $cversion =~ ^1\.[0-9]+\.[0-9]+$ ]]; then
    echo "build.sh: CloudNativePG version must look like 1.28.1, got '$cversion'" >&2
    exit 2
  fi
  cdir=${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/cnpg-$cversion
  crd=$cdir/postgresql.cnpg.io_clusters.yaml
  if [[ ! -s $crd ]]; then
    find_go "the CloudNativePG CRD into $cdir"
    mkdir -p "$cdir"
    exec 9>"$cdir/fetch.lock"
    flock 9
    if [[ ! -s $crd ]]; then
      # `go mod download` works outside any module and checks the zip against the checksum
      # database, so the file is exactly the one tagged in the operator's repository.
      moddir=$(cd "$cdir" && run_go mod download -json "github.com/cloudnative-pg/cloudnative-pg@v$cversion" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
      source=$moddir/config/crd/bases/postgresql.cnpg.io_clusters.yaml
      if [[ ! -f $source ]]; then
        echo "build.sh: no Cluster CRD in github.com/cloudnative-pg/cloudnative-pg@v$cversion" \
          "(looked for $source)" >&2
        exit 1
      fi
      # The module cache holds its files read-only; the copy should not be.
      install -m 0644 "$source" "$cdir/.partial.yaml"
      mv -f "$cdir/.partial.yaml" "$crd"
      echo "build.sh: CloudNativePG v$cversion Cluster CRD fetched" >&2
    fi
  fi
  echo "$crd"
  exit 0
fi

# With `node`, the node's own components are built too (kubelet, kube-controller-manager,
# kube-scheduler, kube-proxy), for the one-node lab in testkit/k8s/node/.
node=0
if [[ ${1:-} == node ]]; then
  node=1
  shift
fi
version=${1:-1.37.2}
if [[ ! $version =~ ^1\.[0-9]+\.[0-9]+$ ]]; then
  echo "build.sh: version must look like 1.37.2, got '$version'" >&2
  exit 2
fi
cache=${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/$version
bin=$cache/bin

commands=(etcd kube-apiserver)
if ((node)); then
  commands+=(kube-scheduler kube-controller-manager kubelet kube-proxy)
fi
have_binaries() {
  local cmd
  for cmd in "${commands[@]}"; do
    [[ -x $bin/$cmd ]] || return 1
  done
}

if have_binaries; then
  echo "$bin"
  exit 0
fi

find_go "${commands[*]} into $bin"

mkdir -p "$cache" "$bin"
# Two test binaries may start the lab at once; one builds while the other waits, then finds the
# binaries and returns.
exec 9>"$cache/build.lock"
flock 9
if have_binaries; then
  echo "$bin"
  exit 0
fi

started=$(date +%s)
mod=$cache/gomod
rm -rf "$mod"
mkdir -p "$mod/cmd/kube-apiserver" "$mod/cmd/etcd"
if ((node)); then
  # Each component's own main package, as in the apiserver's case below: NewXCommand from the
  # component's app package, run through component-base's cli.
  for cmd in kube-scheduler kube-controller-manager kube-proxy; do
    case $cmd in
      kube-scheduler) ctor=NewSchedulerCommand ;;
      kube-controller-manager) ctor=NewControllerManagerCommand ;;
      kube-proxy) ctor=NewProxyCommand ;;
    esac
    mkdir -p "$mod/cmd/$cmd"
    cat >"$mod/cmd/$cmd/main.go" <<GO
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/$cmd/app"
)

func main() {
	os.Exit(cli.Run(app.$ctor()))
}
GO
  done
  mkdir -p "$mod/cmd/kubelet"
  cat >"$mod/cmd/kubelet/main.go" <<'GO'
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
GO
fi

# kube-apiserver's own main package, linked against k8s.io/kubernetes used as a library.
cat >"$mod/cmd/kube-apiserver/main.go" <<'GO'
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
GO

# etcd at exactly the server version that k8s.io/kubernetes itself pins.
cat >"$mod/cmd/etcd/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
GO

cd "$mod"
kmod=$(run_go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [[ ! -f $kmod ]]; then
  echo "build.sh: could not download k8s.io/kubernetes@v$version from the module proxy" >&2
  exit 1
fi

# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0
# and points them at ./staging with replace lines, which do not apply to a module that merely
# depends on it. Each staging module is published as v0.<minor>.<patch>, so our own go.mod
# replaces every k8s.io module required at v0.0.0 with that release.
published=0.${version#1.}
run_go mod init pgwake.local/k8s-lab >/dev/null 2>&1
run_go mod edit -go="$(awk '$1 == "go" { print $2; exit }' "$kmod")"
godebug=$(awk '$1 == "godebug" { print $2; exit }' "$kmod")
[[ -z $godebug ]] || run_go mod edit -godebug="$godebug"
run_go mod edit -require="k8s.io/kubernetes@v$version"
while read -r module; do
  run_go mod edit -replace="$module=$module@v$published"
done < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$kmod" | sort -u)
run_go mod tidy

# Stamp the version the way release builds do, so /version and client checks see a real one.
vpkg=k8s.io/component-base/version
minor=$(cut -d. -f2 <<<"$version")
ldflags="-s -w -X $vpkg.gitVersion=v$version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
ldflags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"

for cmd in "${commands[@]}"; do
  # A binary already built (say kube-apiserver, before the node was asked for) is kept.
  [[ -x $bin/$cmd ]] && continue
  t0=$(date +%s)
  # Build under a temporary name and rename, so an interrupted build never looks finished.
  run_go build -trimpath -ldflags "$ldflags" -o "$bin/.$cmd.partial" "./cmd/$cmd"
  mv -f "$bin/.$cmd.partial" "$bin/$cmd"
  echo "build.sh: $cmd built in $(($(date +%s) - t0)) s" >&2
done
echo "kubernetes v$version (${commands[*]}) built in $(($(date +%s) - started)) s on $(nproc) cores" \
  >>"$cache/build-time.txt"
tail -n 1 "$cache/build-time.txt" >&2
echo "$bin"
