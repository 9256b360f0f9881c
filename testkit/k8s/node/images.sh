#!/usr/bin/env bash
# Builds the one-node lab's container images as OCI archives, from Debian's packages and Go
# modules only (no registry is reachable, and no image builder runs here), and prints the
# directory holding them last. Each image is built once and then kept:
#
#   pgwake.local/pause:1                 the pod sandbox (pause.c, linked statically)
#   pgwake.local/busybox:1               Debian's busybox-static, for smoke tests
#   pgwake.local/postgresql:15.18        Debian bookworm's postgresql-15, user postgres = uid 26
#                                        as CloudNativePG expects; the tag carries the version,
#                                        which is how the operator learns the major version
#   pgwake.local/cloudnative-pg:1.28.1   the operator's manager, built from its Go module
#   pgwake.local/coredns:1.14.7          CoreDNS with the few plugins cluster DNS needs
#   pgwake.local/pgwake:dev              this checkout's gateway (`images.sh pgwake` rebuilds it)
#
# usage: testkit/k8s/node/images.sh            build what is missing
#        testkit/k8s/node/images.sh pgwake     rebuild the pgwake image from this checkout
#
# Environment: PGWAKE_GO as for ../build.sh; CARGO_TARGET_DIR is honoured for the gateway, and
# PGWAKE_NODE_PROFILE picks its cargo profile (default release, as deploy/Dockerfile builds it;
# `dev` reuses a test build, whose dependencies are optimised too).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
out=${XDG_CACHE_HOME:-$HOME/.cache}/pgwake/k8s/node-images
mkdir -p "$out"
exec 9>"$out/build.lock"
flock 9

pack() { python3 "$here/oci-image.py" "$@"; }
export GOTOOLCHAIN=local
export GOFLAGS="-modcacherw ${GOFLAGS:-}"
go=${PGWAKE_GO:-$(command -v go || echo /usr/local/go/bin/go)}
cnpg_version=1.28.1
coredns_version=1.14.7
pg_tag=15.18

# A Debian bookworm root (minbase) that the Postgres and gateway images start from.
base_rootfs() {
  if [[ ! -d $out/base-rootfs ]]; then
    command -v debootstrap >/dev/null || { echo "images.sh: apt-get install debootstrap" >&2; exit 1; }
    rm -rf "$out/base-rootfs.partial"
    nice -n 10 debootstrap --variant=minbase bookworm "$out/base-rootfs.partial" \
      http://deb.debian.org/debian >"$out/debootstrap.log" 2>&1
    mv "$out/base-rootfs.partial" "$out/base-rootfs"
  fi
}

if [[ ${1:-} != pgwake ]]; then
  if [[ ! -f $out/pause.tar ]]; then
    root=$(mktemp -d)
    gcc -static -O2 -s -o "$root/pause" "$here/pause.c"
    pack "$root" "$out/pause.tar" pgwake.local/pause:1 --entrypoint '["/pause"]'
    rm -rf "$root"
  fi

  if [[ ! -f $out/busybox.tar ]]; then
    [[ -x /bin/busybox ]] || { echo "images.sh: apt-get install busybox-static" >&2; exit 1; }
    root=$(mktemp -d)
    mkdir -p "$root/bin" "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    for applet in sh ls cat sleep ip wget nc hostname ps env nslookup; do
      ln -s busybox "$root/bin/$applet"
    done
    pack "$root" "$out/busybox.tar" pgwake.local/busybox:1 --cmd '["sh"]'
    rm -rf "$root"
  fi

  if [[ ! -f $out/postgresql.tar ]]; then
    base_rootfs
    root=$out/pg-rootfs
    rm -rf "$root"
    cp -a "$out/base-rootfs" "$root"
    # CloudNativePG runs Postgres as uid/gid 26, and initdb wants its user in /etc/passwd.
    # Debian's gid 26 is `tape`; it moves aside. No cluster is created at install time.
    chroot "$root" sh -ec '
      groupmod -g 126 tape
      groupadd -g 26 postgres
      useradd -u 26 -g 26 -d /var/lib/postgresql -s /bin/sh postgres
      mkdir -p /etc/postgresql-common
      echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf'
    mount -t proc proc "$root/proc"
    nice -n 10 chroot "$root" sh -ec '
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15
      apt-get clean
      rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man' >"$out/postgresql-apt.log" 2>&1 ||
      { umount "$root/proc"; echo "images.sh: installing postgresql-15 failed ($out/postgresql-apt.log)" >&2; exit 1; }
    umount "$root/proc"
    pack "$root" "$out/postgresql.tar" "pgwake.local/postgresql:$pg_tag" \
      --env "PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --user 26:26 --cmd '["postgres"]'
    rm -rf "$root"
  fi

  if [[ ! -f $out/cloudnative-pg.tar ]]; then
    root=$(mktemp -d)
    gobuild=$(mktemp -d)
    # The tagged release's own source tree and go.sum, from the module proxy (`go install
    # module@version` would also want the module's version list, which the proxy refuses).
    src=$(cd "$gobuild" && "$go" mod download -json "github.com/cloudnative-pg/cloudnative-pg@v$cnpg_version" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
    cp -r "$src/." "$gobuild/"
    chmod -R u+w "$gobuild"
    # Laid out as the release image is: the operator finds the instance manager binaries it can
    # hand to pods as operator/manager_<arch>, and /manager points at this machine's one.
    mkdir -p "$root/operator"
    ln -s operator/manager_amd64 "$root/manager"
    (cd "$gobuild" && CGO_ENABLED=0 nice -n 19 "$go" build -trimpath -o "$root/operator/manager_amd64" \
      -ldflags "-s -w -X github.com/cloudnative-pg/cloudnative-pg/pkg/versions.buildVersion=$cnpg_version" \
      ./cmd/manager)
    mkdir -p "$root/controller" "$root/tmp"
    chmod 1777 "$root/tmp"
    pack "$root" "$out/cloudnative-pg.tar" "pgwake.local/cloudnative-pg:$cnpg_version" \
      --entrypoint '["/manager"]' --user 10001:10001 --workdir /
    rm -rf "$root" "$gobuild"
  fi

  if [[ ! -f $out/coredns.tar ]]; then
    root=$(mktemp -d)
    mod=$(mktemp -d)
    # Cluster DNS only: answers for cluster.local from the API, nothing is forwarded anywhere.
    cat >"$mod/main.go" <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order a query passes them.
func init() {
	dnsserver.Directives = []string{"ready", "health", "errors", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
GO
    (cd "$mod" && nice -n 19 "$go" mod init pgwake.local/coredns >/dev/null 2>&1 &&
      nice -n 19 "$go" get "github.com/coredns/coredns@v$coredns_version" >/dev/null 2>&1 &&
      nice -n 19 "$go" mod tidy >/dev/null 2>&1 &&
      CGO_ENABLED=0 nice -n 19 "$go" build -trimpath -ldflags "-s -w" -o "$root/coredns" .)
    mkdir -p "$root/etc/coredns"
    pack "$root" "$out/coredns.tar" "pgwake.local/coredns:$coredns_version" \
      --entrypoint '["/coredns"]' --user 65532:65532
    rm -rf "$root" "$mod"
  fi
fi

if [[ ${1:-} == pgwake || ! -f $out/pgwake.tar ]]; then
  base_rootfs
  target=${CARGO_TARGET_DIR:-$repo/target}
  profile=${PGWAKE_NODE_PROFILE:-release}
  (cd "$repo" && nice -n 5 cargo build --profile "$profile" --locked -p pgwake >&2)
  [[ $profile == dev ]] && profile_dir=debug || profile_dir=$profile
  root=$out/pgwake-rootfs
  rm -rf "$root"
  cp -a "$out/base-rootfs" "$root"
  mkdir -p "$root/usr/local/bin"
  # Debug information is for the build machine; the image gets the code only.
  objcopy --strip-debug "$target/$profile_dir/pgwake" "$root/usr/local/bin/pgwake"
  chmod 0755 "$root/usr/local/bin/pgwake"
  # deploy/Dockerfile's runtime stage: an unprivileged numeric user, the gateway as entrypoint.
  pack "$root" "$out/pgwake.tar" pgwake.local/pgwake:dev \
    --entrypoint '["/usr/local/bin/pgwake"]' \
    --cmd '["serve", "--config", "/etc/pgwake/config/pgwake.toml"]' --user 65532:65532
  rm -rf "$root"
fi

echo "$out"
