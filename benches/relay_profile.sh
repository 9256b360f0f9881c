#!/usr/bin/env bash
# Where the relay's CPU goes, counted in instructions (valgrind's callgrind), which a busy machine
# does not change: pgwake (a `fixed` tenant) and the bare tokio relay of `examples/relay_floor.rs`
# each run under callgrind while `pgbench -n -S` drives a fixed number of transactions through
# them, after a warm-up that is not counted. Prints instructions per transaction for both, and
# pgwake's functions by their own instructions per transaction.
#
#   bash benches/relay_profile.sh [simple|extended] [TRANSACTIONS_PER_CLIENT] [plain|tls]
#
# Needs Debian's postgresql and valgrind packages and a release build:
#   cargo build --release -p pgwake -p pgwake-bench --example relay_floor
# Run as root, it starts Postgres as the postgres account. Everything it started is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-simple}"
per_client="${2:-2000}"
transport="${3:-plain}"
clients=4
target_dir="${CARGO_TARGET_DIR:-target}"
pgwake="$target_dir/release/pgwake"
floor="$target_dir/release/examples/relay_floor"
bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
for f in "$pgwake" "$floor" "$bin/pgbench" "$(command -v valgrind)"; do
  test -x "$f" || { echo "missing $f" >&2; exit 1; }
done

dir="$(mktemp -d /tmp/pgwake-profile-XXXXXX)"
chown postgres: "$dir"
pids=()
pg_pid=""
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$pg_pid" ] && kill -INT "$pg_pid" 2>/dev/null || true
  pids+=("$pg_pid")
  for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  [ -n "${KEEP_PROFILE:-}" ] && echo "kept $dir" >&2 || rm -rf "$dir"
}
trap cleanup EXIT

# shellcheck source=benches/ports.sh
source benches/ports.sh

pg_port=$(pick_port)
setpriv --reuid=postgres --regid=postgres --init-groups -- "$bin/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
setpriv --reuid=postgres --regid=postgres --init-groups -- "$bin/postgres" -D "$dir/data" -p "$pg_port" -k "$dir" \
  -c listen_addresses=127.0.0.1 -c max_connections=50 >"$dir/pg.log" 2>&1 &
pg_pid=$!
wait_port "$pg_port" 60
sleep 1
"$bin/pgbench" -q -i -s 1 -h 127.0.0.1 -p "$pg_port" -U postgres postgres >/dev/null 2>&1

gw_port=$(pick_port)
admin_port=$(pick_port)
tls_lines=""
sslmode=disable
if [ "$transport" = tls ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/key.pem" -out "$dir/cert.pem" \
    -days 1 -subj "/CN=localhost" >/dev/null 2>&1
  tls_lines="cert = \"$dir/cert.pem\"
key = \"$dir/key.pem\""
  sslmode=require
fi
cat >"$dir/pgwake.toml" <<EOF
[listen]
postgres = "127.0.0.1:$gw_port"
admin = "127.0.0.1:$admin_port"
allow_plaintext = true

[tls]
$tls_lines

[routing]
rules = ["database"]
default_tenant = "bench"

[[tenant]]
id = "bench"
backend = { kind = "fixed", address = "127.0.0.1:$pg_port" }
EOF
[ -n "$tls_lines" ] || sed -i '/^\[tls\]$/d' "$dir/pgwake.toml"
PGWAKE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dir/pgwake.%p.out" \
  "$pgwake" serve --config "$dir/pgwake.toml" >"$dir/pgwake.log" 2>&1 &
pgwake_pid=$!
pids+=("$pgwake_pid")
floor_port=$(pick_port)
valgrind --tool=callgrind --callgrind-out-file="$dir/floor.%p.out" \
  "$floor" tokio "$floor_port" "$pg_port" >"$dir/floor.log" 2>&1 &
floor_pid=$!
pids+=("$floor_pid")
wait_port "$gw_port" 60
wait_port "$floor_port" 60

# Instructions per transaction through the relay process `pid` listening on `port`.
measure() {
  local pid=$1 port=$2 name=$3 conninfo
  conninfo="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=$sslmode"
  [ "$name" = floor ] && conninfo="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable"
  "$bin/pgbench" -n -S -M "$mode" -c "$clients" -j 2 -t 200 "$conninfo" >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null
  "$bin/pgbench" -n -S -M "$mode" -c "$clients" -j 2 -t "$per_client" "$conninfo" >/dev/null 2>&1
  callgrind_control -d "$name" "$pid" >/dev/null
  local dump
  dump=$(ls -t "$dir/$name".*.out.* 2>/dev/null | head -n 1)
  local total
  total=$(sed -n 's/^summary: //p;s/^totals: //p' "$dump" | head -n 1 | awk '{print $1}')
  local tx=$((per_client * clients))
  echo "$name: $((total / tx)) instructions per transaction ($tx transactions, -M $mode, $transport)"
  echo "$dump" >"$dir/$name.last"
}
measure "$floor_pid" "$floor_port" floor
measure "$pgwake_pid" "$gw_port" pgwake
tx=$((per_client * clients))
echo
echo "pgwake, by function (own instructions per transaction, top 40):"
callgrind_annotate --inclusive=no --threshold=100 "$(cat "$dir/pgwake.last")" 2>/dev/null \
  | awk -v tx="$tx" '/^ *[0-9,]+ \(/ { n=$1; gsub(",", "", n); $1=""; $2="";
      printf "%8.0f  %s\n", n / tx, $0; if (++k == 40) exit }'
