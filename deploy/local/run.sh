#!/usr/bin/env bash
# Runs pgwake on this machine in front of a local PostgreSQL it sets up in ./.pgwake:
# a cluster (initdb as the postgres account when run as root), a self-signed certificate,
# a config with tenant "alpha", then the gateway in the foreground. Ctrl-C stops both.
# The embedded local backend (pgwake quickstart) will replace this script.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${PGWAKE_DIR:-$PWD/.pgwake}"
port="${PGWAKE_PORT:-6432}"
admin_port="${PGWAKE_ADMIN_PORT:-9090}"
pg_port="${PGWAKE_PG_PORT:-54329}"

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bin" ]; then
  echo "PostgreSQL is not installed: apt-get install -y postgresql" >&2
  exit 1
fi
as_pg=()
if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); fi

mkdir -p "$dir"
if [ ! -f "$dir/pg/PG_VERSION" ]; then
  mkdir -p "$dir/pg" "$dir/sock"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir/pg" "$dir/sock"
  chmod 700 "$dir/pg"
  echo "pgwake-local" > "$dir/pw"; chmod 644 "$dir/pw"
  "${as_pg[@]}" "$bin/initdb" -D "$dir/pg" -U pgwake --pwfile="$dir/pw" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$dir/pw"
fi
if [ ! -f "$dir/cert.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
    -subj "/CN=pgwake-local" -addext "subjectAltName=DNS:*.db.localtest,DNS:localhost" \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>/dev/null
fi
cat > "$dir/pgwake.toml" <<TOML
[listen]
postgres = "127.0.0.1:$port"
admin = "127.0.0.1:$admin_port"
[tls]
cert = "cert.pem"
key = "key.pem"
[routing]
sni_suffix = "db.localtest"
rules = ["sni", "options", "database", "user"]
[[tenant]]
id = "alpha"
backend = { kind = "fixed", address = "127.0.0.1:$pg_port" }
TOML

"${as_pg[@]}" "$bin/postgres" -D "$dir/pg" -p "$pg_port" -k "$dir/sock" \
  -c listen_addresses=127.0.0.1 >"$dir/postgres.log" 2>&1 &
# runuser does not pass signals on, so stop the postmaster by the pid it records.
stop_pg() {
  local pid
  pid=$(head -n 1 "$dir/pg/postmaster.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -INT "$pid" 2>/dev/null
  wait 2>/dev/null || true
}
trap stop_pg EXIT
cargo build --release -q -p pgwake
cat <<MSG
pgwake on 127.0.0.1:$port, admin on 127.0.0.1:$admin_port (/metrics, /healthz, /readyz).
Connect (password: pgwake-local):
  psql "host=alpha.db.localtest hostaddr=127.0.0.1 port=$port sslmode=require user=pgwake dbname=postgres"
  psql "postgresql://pgwake@127.0.0.1:$port/alpha.postgres?sslmode=require"
MSG
"${CARGO_TARGET_DIR:-target}/release/pgwake" serve --config "$dir/pgwake.toml"
