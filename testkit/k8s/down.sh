#!/usr/bin/env bash
# Stops what up.sh started in WORKDIR: the watchdog, then kube-apiserver, then etcd (so the API
# server never runs without its storage), each by the PID recorded in WORKDIR.
#
# usage: testkit/k8s/down.sh WORKDIR
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 WORKDIR" >&2
  exit 2
fi
work=$1

# stop NAME EXPECTED: TERM, up to 10 s of grace, then KILL. The command line is checked first,
# so a stale PID file never gets an unrelated process (one that reused the PID) killed.
stop() {
  local file=$work/$1.pid expected=$2 pid
  [[ -f $file ]] || return 0
  pid=$(<"$file")
  if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$expected"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$file"
}

stop watchdog pgwake-k8s-watchdog
stop apiserver kube-apiserver
stop etcd etcd
exit 0
