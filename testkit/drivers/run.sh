#!/usr/bin/env bash
# Runs the drivers' own test suites (pgx, psycopg) directly against PostgreSQL and through
# pgwake, and prints the tests whose outcome differs, checked against expected-differences.tsv.
# See README.md in this folder. Not part of .ci/run: a full run takes tens of minutes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

pgx_version=v5.12.0
psycopg_tests=""
suites="pgx,psycopg"
modes="relay"
reruns=2
workdir=""
pgwake_bin=""
psycopg_sslmode=require
# psycopg's test files by name: `default` the protocol-heavy ones (about 1,100 tests), `wide`
# every file of the areas issue 46 names (about 2,700 tests: every cursor kind, concurrency,
# two-phase commit, waiting, errors, the DB-API compliance suite too).
psycopg_default="tests/pq tests/test_connection.py tests/test_connection_async.py \
tests/test_cursor.py tests/test_cursor_async.py tests/test_copy.py tests/test_copy_async.py \
tests/test_pipeline.py tests/test_pipeline_async.py tests/test_prepared.py \
tests/test_prepared_async.py tests/test_notify.py tests/test_notify_async.py \
tests/test_transaction.py tests/test_transaction_async.py"
psycopg_wide="tests/pq tests/test_connection.py tests/test_connection_async.py \
tests/test_connection_info.py tests/test_cursor.py tests/test_cursor_async.py \
tests/test_cursor_client.py tests/test_cursor_client_async.py tests/test_cursor_common.py \
tests/test_cursor_common_async.py tests/test_cursor_raw.py tests/test_cursor_raw_async.py \
tests/test_cursor_server.py tests/test_cursor_server_async.py tests/test_copy.py \
tests/test_copy_async.py tests/test_pipeline.py tests/test_pipeline_async.py \
tests/test_prepared.py tests/test_prepared_async.py tests/test_notify.py \
tests/test_notify_async.py tests/test_concurrency.py tests/test_concurrency_async.py \
tests/test_tpc.py tests/test_tpc_async.py tests/test_transaction.py \
tests/test_transaction_async.py tests/test_waiting.py tests/test_waiting_async.py \
tests/test_errors.py tests/test_xid.py tests/test_psycopg_dbapi20.py"
psycopg_files=$psycopg_default

usage() {
    cat <<EOF
usage: $0 [options]
  --suites pgx,psycopg     suites to run (default: $suites)
  --pgx VERSION            pgx v5 version from the Go module proxy (default: $pgx_version)
  --psycopg-tests DIR      a psycopg source checkout (its tests/ folder is run; see README.md)
  --psycopg-files "F ..."  test files or folders under the checkout, or a named set: default
                           (the protocol-heavy files) or wide (the areas issue 46 names)
  --psycopg-sslmode MODE   sslmode of psycopg's connections (default: $psycopg_sslmode;
                           disable tells a client-side TLS cause from the gateway's)
  --modes relay,parked     through pgwake as configured by default (relay) and/or with
                           park_session_after = 200ms, snapshot_after = 100ms (parked)
  --reruns N               run each test whose outcome differs N more times on each side, to
                           tell a steady difference from a flaky test (default: $reruns)
  --pgwake PATH            the gateway binary (default: cargo build, debug profile)
  --workdir DIR            where servers, results and logs go (default: a new temporary folder)
EOF
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --suites) suites=$2; shift 2 ;;
        --pgx) pgx_version=$2; shift 2 ;;
        --psycopg-tests) psycopg_tests=$(cd "$2" && pwd); shift 2 ;;
        --psycopg-files)
            case "$2" in
                default) psycopg_files=$psycopg_default ;;
                wide) psycopg_files=$psycopg_wide ;;
                *) psycopg_files=$2 ;;
            esac
            shift 2 ;;
        --psycopg-sslmode) psycopg_sslmode=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        --reruns) reruns=$2; shift 2 ;;
        --pgwake) pgwake_bin=$2; shift 2 ;;
        --workdir) workdir=$2; shift 2 ;;
        *) usage ;;
    esac
done
case ",$suites," in *,psycopg,*)
    [ -n "$psycopg_tests" ] && [ -d "$psycopg_tests/tests" ] ||
        { echo "--psycopg-tests: a psycopg checkout is needed (see README.md)" >&2; exit 2; } ;;
esac

pg_bin=${PGWAKE_PG_BIN:-/usr/lib/postgresql/15/bin}
[ -x "$pg_bin/postgres" ] || { echo "no PostgreSQL 15 in $pg_bin (set PGWAKE_PG_BIN)" >&2; exit 2; }
if [ -z "$pgwake_bin" ]; then
    (cd "$repo" && cargo build -q -p pgwake --bin pgwake)
    pgwake_bin=${CARGO_TARGET_DIR:-$repo/target}/debug/pgwake
fi
workdir=${workdir:-$(mktemp -d -t pgwake-drivers.XXXXXX)}
mkdir -p "$workdir"
chmod 755 "$workdir"
echo "work folder: $workdir"

# Postgres refuses to run as root: the server runs as the postgres account then.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    [ -f "$workdir/pg/postmaster.pid" ] && as_pg "$pg_bin/pg_ctl" -D "$workdir/pg" -m fast stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

# One CA and one server certificate, for Postgres and for the gateway.
certs() {
    local d=$workdir/certs
    mkdir -p "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=drivers-ca \
        -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj /CN=localhost \
        -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$d/san.ext"
    openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
        -days 2 -extfile "$d/san.ext" -out "$d/server.pem" 2>/dev/null
    chmod 644 "$d"/*.pem
}

# PostgreSQL with TLS, SCRAM over TCP (md5 for pgx's md5 user), the suites' databases and users.
postgres_start() {
    local data=$workdir/pg
    pg_port=$(free_port)
    echo secret >"$workdir/pwfile"
    chmod 644 "$workdir/pwfile"
    mkdir -p "$data"
    [ "$(id -u)" = 0 ] && chown postgres: "$data"
    as_pg "$pg_bin/initdb" -D "$data" -U postgres --pwfile="$workdir/pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 >"$workdir/initdb.log"
    install -m 600 -o "$(stat -c %u "$data")" "$workdir/certs/server.key" "$data/server.key"
    install -m 644 -o "$(stat -c %u "$data")" "$workdir/certs/server.pem" "$data/server.crt"
    cat >>"$data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$data'
ssl = on
max_connections = 200
max_prepared_transactions = 10
EOF
    cat >"$data/pg_hba.conf" <<EOF
local all all trust
host all pgx_md5 127.0.0.1/32 md5
host all all 127.0.0.1/32 scram-sha-256
EOF
    as_pg "$pg_bin/pg_ctl" -D "$data" -l "$data/postgres.log" -w start >/dev/null
    local psql=("$pg_bin/psql" -h "$data" -p "$pg_port" -U postgres -X -q -v ON_ERROR_STOP=1)
    as_pg "${psql[@]}" -d postgres -c "create database pgx_test" -c "create database psycopg_test"
    as_pg "${psql[@]}" -d pgx_test -f "$pgx_dir/testsetup/postgresql_setup.sql" >/dev/null 2>&1 ||
        [ -z "$pgx_dir" ] || { echo "pgx's postgresql_setup.sql failed" >&2; exit 1; }
    as_pg "${psql[@]}" -d psycopg_test -c "create extension if not exists hstore"
}

# The gateway: TLS, SCRAM at the gateway (static credentials), one fixed tenant routed by
# options=endpoint=drivers, so the database name the client uses is the one Postgres sees.
gateway_start() {
    local mode=$1 dir=$workdir/gw-$mode
    mkdir -p "$dir"
    gw_port=$(free_port)
    local admin
    admin=$(free_port)
    cat >"$dir/users.txt" <<EOF
"postgres" "secret"
"pgx_pw" "secret"
"pgx_scram" "secret"
"pgx_ssl" "secret"
"pgx_md5" "secret"
EOF
    local revival=""
    if [ "$mode" = parked ]; then
        revival=$'[revival]\npark_session_after = "200ms"\nsnapshot_after = "100ms"'
    fi
    cat >"$dir/pgwake.toml" <<EOF
[listen]
postgres = "127.0.0.1:$gw_port"
admin = "127.0.0.1:$admin"
allow_plaintext = true

[tls]
cert = "$workdir/certs/server.pem"
key = "$workdir/certs/server.key"

[routing]
rules = ["options"]

$revival

[[tenant]]
id = "drivers"
backend = { kind = "fixed", address = "127.0.0.1:$pg_port" }
credentials = { kind = "static", file = "users.txt" }
EOF
    PGWAKE_LOG=${PGWAKE_LOG:-info} "$pgwake_bin" serve --config "$dir/pgwake.toml" \
        >>"$dir/pgwake.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "pgwake did not start: $dir/pgwake.log" >&2
    exit 1
}

# Stops the gateway started last and waits for it to exit, so the backend connections it kept
# for reuse are gone before the suite runs directly again (a kept backend shows in
# pg_stat_activity with the client's application_name, which some tests look up).
gateway_stop() {
    local pid=${pids[-1]}
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# Connection settings of a run: directly (port of Postgres) or through pgwake.
conninfo() {
    local target=$1 user=$2 db=$3 extra=${4:-}
    if [ "$target" = direct ]; then
        echo "host=127.0.0.1 port=$pg_port user=$user password=secret dbname=$db $extra"
    else
        echo "host=127.0.0.1 port=$gw_port user=$user password=secret dbname=$db options=endpoint=drivers $extra"
    fi
}

pgx_fetch() {
    local mod
    mod=$(cd "$workdir" && go mod download -json "github.com/jackc/pgx/v5@$pgx_version" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    pgx_dir=$workdir/pgx-$pgx_version
    rm -rf "$pgx_dir"
    cp -r "$mod" "$pgx_dir"
    chmod -R u+w "$pgx_dir"
}

# The connection strings pgx's tests read, for `target`.
pgx_env() {
    local target=$1
    local tls="sslmode=verify-full sslrootcert=$workdir/certs/ca.pem host=localhost"
    export PGX_TEST_DATABASE="$(conninfo "$target" pgx_pw pgx_test sslmode=require)"
    export PGX_TEST_TCP_CONN_STRING="$PGX_TEST_DATABASE"
    export PGX_TEST_SCRAM_PASSWORD_CONN_STRING="$(conninfo "$target" pgx_scram pgx_test sslmode=require)"
    export PGX_TEST_TLS_CONN_STRING="$(conninfo "$target" pgx_ssl pgx_test) $tls"
    export PGX_TEST_SCRAM_PLUS_CONN_STRING="$(conninfo "$target" pgx_scram pgx_test) $tls channel_binding=require"
}

pgx_run() {
    local target=$1 label=$2
    echo "pgx $pgx_version $label: go test ./... (log: $workdir/pgx-$label.json)"
    (
        cd "$pgx_dir"
        pgx_env "$target"
        go test -json -count=1 -p 1 -timeout 30m ./... >"$workdir/pgx-$label.json" 2>"$workdir/pgx-$label.stderr" || true
    )
    python3 "$here/outcomes.py" go "$workdir/pgx-$label.json" >"$workdir/pgx-$label.tsv"
}

# Runs again the top-level tests of the ids in `ids` (`<package> <test>[/<subtest>]`), each
# package once, and appends their outcomes to the label's rerun file.
pgx_rerun() {
    local target=$1 label=$2 ids=$3
    (
        cd "$pgx_dir"
        pgx_env "$target"
        for package in $(cut -d' ' -f1 "$ids" | sort -u); do
            local tests
            tests=$(grep "^$package " "$ids" | cut -d' ' -f2 | cut -d/ -f1 | { grep -v '^(package)$' || true; } | sort -u | paste -sd'|')
            [ -n "$tests" ] || continue
            go test -json -count=1 -timeout 10m -run "^($tests)\$" "$package" 2>/dev/null || true
        done >"$workdir/pgx-$label.rerun.json"
    )
    python3 "$here/outcomes.py" go "$workdir/pgx-$label.rerun.json" >>"$workdir/pgx-$label.rerun.tsv"
}

psycopg_run() {
    local target=$1 label=$2
    echo "psycopg $label: pytest $psycopg_files (log: $workdir/psycopg-$label.log)"
    # shellcheck disable=SC2086
    psycopg_pytest "$target" "$label" "$workdir/psycopg-$label.xml" $psycopg_files \
        >"$workdir/psycopg-$label.log" 2>&1
    python3 "$here/outcomes.py" junit "$workdir/psycopg-$label.xml" >"$workdir/psycopg-$label.tsv"
}

# pytest in the checkout against `target`, with a JUnit report in `xml`.
psycopg_pytest() {
    local target=$1 label=$2 xml=$3
    shift 3
    local timeout=()
    python3 -c 'import pytest_timeout' 2>/dev/null && timeout=(--timeout 120)
    (
        cd "$psycopg_tests"
        PSYCOPG_TEST_DSN="$(conninfo "$target" postgres psycopg_test "sslmode=$psycopg_sslmode")" \
            python3 -m pytest "$@" -p no:randomly "${timeout[@]}" \
            -o cache_dir="$workdir/pytest-cache-$label" --junitxml="$xml" -q || true
    )
}

psycopg_rerun() {
    local target=$1 label=$2 ids=$3
    mapfile -t tests <"$ids"
    [ ${#tests[@]} -gt 0 ] || return 0
    psycopg_pytest "$target" "$label" "$workdir/psycopg-$label.rerun.xml" "${tests[@]}" \
        >>"$workdir/psycopg-$label.rerun.log" 2>&1
    python3 "$here/outcomes.py" junit "$workdir/psycopg-$label.rerun.xml" >>"$workdir/psycopg-$label.rerun.tsv"
}

pgx_dir=""
case ",$suites," in *,pgx,*) pgx_fetch ;; esac
certs
postgres_start

status=0
for suite in ${suites//,/ }; do
    "${suite}_run" direct direct
    for mode in ${modes//,/ }; do
        gateway_start "$mode"
        "${suite}_run" gateway "pgwake-$mode"
        ids=$workdir/$suite-pgwake-$mode.differing
        python3 "$here/outcomes.py" differing "$workdir/$suite-direct.tsv" \
            "$workdir/$suite-pgwake-$mode.tsv" >"$ids"
        for _ in $(seq "$reruns"); do
            [ -s "$ids" ] || break
            echo "$suite $mode: $(wc -l <"$ids") tests differ; running them again on each side"
            gateway_stop
            "${suite}_rerun" direct direct "$ids"
            gateway_start "$mode"
            "${suite}_rerun" gateway "pgwake-$mode" "$ids"
        done
        gateway_stop
        python3 "$here/outcomes.py" diff "$suite" "$workdir/$suite-direct.tsv" \
            "$workdir/$suite-pgwake-$mode.tsv" "$here/expected-differences.tsv" "$mode" || status=1
    done
done
exit $status
