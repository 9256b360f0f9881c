#!/usr/bin/env bash
# The relay floor, side by side in one run: `pgbench -n -S -M simple -c 16 -j 2` (plaintext,
# trust) against Postgres direct, PgBouncer (session mode), pgwake (a `fixed` tenant) and the two
# bare relays of `examples/relay_floor.rs` (tokio and io_uring), target order rotated each
# repetition. Prints tps and the proxy's CPU (utime + stime from /proc) per transaction.
#
#   bash benches/relay_floor.sh [REPS] [SECONDS]
#
# Needs Debian's postgresql and pgbouncer packages and a release build:
#   cargo build --release -p pgwake -p pgwake-bench --example relay_floor
# Run as root, it starts Postgres and PgBouncer as the postgres account without a new session,
# so every process shares the script's autogroup. Everything it started is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-3}"
seconds="${2:-10}"
target_dir="${CARGO_TARGET_DIR:-target}"
pgwake="$target_dir/release/pgwake"
floor="$target_dir/release/examples/relay_floor"
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
for f in "$pgwake" "$floor" "$bin/pgbench" "$(command -v pgbouncer)"; do
  test -x "$f" || { echo "missing $f" >&2; exit 1; }
done

dir="$(mktemp -d /tmp/pgwake-floor-XXXXXX)"
chown postgres: "$dir"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }
pids=()
pg_pid=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # Postgres last, with a fast shutdown, once the proxies' connections are gone.
  [ -n "$pg_pid" ] && kill -INT "$pg_pid" 2>/dev/null || true
  pids+=("$pg_pid")
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  rm -rf "$dir"
}
trap cleanup EXIT

# shellcheck source=benches/ports.sh
source benches/ports.sh

pg_port=$(pick_port)
as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
setpriv --reuid=postgres --regid=postgres --init-groups -- "$bin/postgres" -D "$dir/data" -p "$pg_port" -k "$dir" -c listen_addresses=127.0.0.1 \
  -c shared_buffers=256MB -c max_connections=200 >"$dir/pg.log" 2>&1 &
pg_pid=$!
wait_port "$pg_port"
sleep 1
"$bin/pgbench" -q -i -s 10 -h 127.0.0.1 -p "$pg_port" -U postgres postgres >/dev/null 2>&1

bouncer_port=$(pick_port)
printf '"postgres" ""\n' >"$dir/users.txt"
cat >"$dir/bouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=$pg_port
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = session
max_client_conn = 200
default_pool_size = 40
logfile = $dir/bouncer.log
log_connections = 0
log_disconnections = 0
EOF
chown postgres: "$dir/bouncer.ini" "$dir/users.txt"
# Not through as_pg: $! must be PgBouncer itself, whose CPU is read.
setpriv --reuid=postgres --regid=postgres --init-groups -- pgbouncer "$dir/bouncer.ini" \
  >/dev/null 2>&1 &
bouncer_pid=$!
pids+=("$bouncer_pid")

gw_port=$(pick_port)
admin_port=$(pick_port)
cat >"$dir/pgwake.toml" <<EOF
[listen]
postgres = "127.0.0.1:$gw_port"
admin = "127.0.0.1:$admin_port"
allow_plaintext = true

[routing]
rules = ["database"]
default_tenant = "bench"

[[tenant]]
id = "bench"
backend = { kind = "fixed", address = "127.0.0.1:$pg_port" }
EOF
PGWAKE_LOG=warn "$pgwake" serve --config "$dir/pgwake.toml" >"$dir/pgwake.log" 2>&1 &
pgwake_pid=$!
pids+=("$pgwake_pid")

tokio_port=$(pick_port)
"$floor" tokio "$tokio_port" "$pg_port" &
tokio_pid=$!
pids+=("$tokio_pid")
uring_port=$(pick_port)
"$floor" uring "$uring_port" "$pg_port" &
uring_pid=$!
pids+=("$uring_pid")
for p in "$bouncer_port" "$gw_port" "$tokio_port" "$uring_port"; do wait_port "$p"; done

tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
names=(direct PgBouncer pgwake bare-tokio bare-io_uring)
ports=("$pg_port" "$bouncer_port" "$gw_port" "$tokio_port" "$uring_port")
procs=("" "$bouncer_pid" "$pgwake_pid" "$tokio_pid" "$uring_pid")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "rep target tps proxy_cpu_us_per_tx"
for rep in $(seq "$reps"); do
  for i in $(seq 0 4); do
    t=$(( (i + rep - 1) % 5 ))
    pid="${procs[$t]}"
    before=0
    [ -n "$pid" ] && before=$(cpu_ticks "$pid")
    out=$("$bin/pgbench" -n -S -M simple -c 16 -j 2 -T "$seconds" -h 127.0.0.1 \
      -p "${ports[$t]}" -U postgres postgres 2>&1)
    sleep 0.3
    tx=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' <<<"$out")
    tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -n 1)
    cpu="-"
    if [ -n "$pid" ]; then
      after=$(cpu_ticks "$pid")
      cpu=$(awk -v a="$after" -v b="$before" -v n="$tx" -v t="$tck" \
        'BEGIN { printf "%.2f", (a - b) / t * 1e6 / n }')
    fi
    echo "$rep ${names[$t]} $tps $cpu"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
