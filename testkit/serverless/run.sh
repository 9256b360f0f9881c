#!/usr/bin/env bash
# Runs the serverless driver's own CLI tests (tests/cli of neondatabase/serverless, its
# committed bundle) against a `pgwake quickstart`, in Node's and the edge runtime's
# environments, and prints the counts and every test that did not pass. See README.md in this
# folder. Not part of .ci/run: it needs the driver's repository and packages from npm.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

tests=""
pgwake_bin=""
settings=production
role=printed
workdir=""
environments="node,edge-runtime"

usage() {
    cat <<EOF
usage: $0 --tests DIR [options]
  --tests DIR              a checkout of neondatabase/serverless (see README.md)
  --settings S             quickstart (its pgwake.toml as written) or production (the same
                           without routing.unknown_tenant = "reveal", the default elsewhere);
                           default: $settings
  --role R                 printed (the URL the quickstart prints) or superuser (the same
                           with local.superuser and local.password); default: $role
  --environments E         vitest environments, comma-separated (default: $environments)
  --pgwake PATH            the gateway binary (default: cargo build, debug profile)
  --workdir DIR            where the quickstart, the packages and the results go (default: a
                           new temporary folder)
EOF
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
    --tests) tests=$2; shift 2 ;;
    --settings) settings=$2; shift 2 ;;
    --role) role=$2; shift 2 ;;
    --environments) environments=$2; shift 2 ;;
    --pgwake) pgwake_bin=$2; shift 2 ;;
    --workdir) workdir=$2; shift 2 ;;
    *) usage ;;
    esac
done
[ -n "$tests" ] && [ -f "$tests/tests/cli/http.test.ts" ] || usage
case "$settings" in quickstart | production) ;; *) usage ;; esac
case "$role" in printed | superuser) ;; *) usage ;; esac

if [ -z "$pgwake_bin" ]; then
    (cd "$repo" && cargo build -q -p pgwake)
    target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    pgwake_bin="$target/debug/pgwake"
fi
workdir=${workdir:-$(mktemp -d -t pgwake-serverless-XXXXXX)}
mkdir -p "$workdir"
chmod 755 "$workdir"
echo "work folder: $workdir"

# The driver as its repository has it, with only the packages tests/cli needs: the full
# devDependencies pull in Prisma, Playwright, Wrangler and Vercel's SDK.
driver="$workdir/serverless"
rm -rf "$driver"
mkdir -p "$driver"
(cd "$tests" && tar --exclude=node_modules --exclude=.git -cf - .) | (cd "$driver" && tar -xf -)
python3 - "$driver/package.json" <<'EOF'
import json, sys
path = sys.argv[1]
package = json.load(open(path))
wanted = {"vitest", "node-fetch", "pg", "subtls", "ws", "typescript", "@types/pg", "@types/ws",
          "@types/node", "@neondatabase/serverless", "@edge-runtime/vm"}
package["devDependencies"] = {
    k: v for k, v in package["devDependencies"].items() if k in wanted
}
package.pop("scripts", None)
json.dump(package, open(path, "w"), indent=2)
EOF
rm -f "$driver/package-lock.json"
(cd "$driver" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
cat >"$driver/tests/pgwake-setup.ts" <<'EOF'
import { neonConfig } from '@neondatabase/serverless';
import { beforeAll } from 'vitest';

// The endpoints of the quickstart's printed snippet.
beforeAll(() => {
  neonConfig.fetchEndpoint = () => process.env.PGWAKE_FETCH!;
  neonConfig.wsProxy = () => process.env.VITE_WSPROXY!;
});
EOF
cat >"$driver/tests/pgwake.config.mts" <<'EOF'
import { defineConfig } from 'vite';

export default defineConfig({
  test: {
    fileParallelism: false,
    setupFiles: ['tests/setup.ts', 'tests/pgwake-setup.ts'],
    testTimeout: 10000,
  },
});
EOF

ports=$(python3 -c '
import socket
held = []
for _ in range(3):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))')
read -r port admin http <<<"$ports"
qs_pid=""
stop_quickstart() {
    if [ -n "$qs_pid" ]; then
        kill "$qs_pid" 2>/dev/null || true
        wait "$qs_pid" 2>/dev/null || true
        qs_pid=""
    fi
}
trap stop_quickstart EXIT
start_quickstart() {
    (cd "$workdir" && exec "$pgwake_bin" quickstart --dir qs --port "$port" --admin-port "$admin" \
        --http-port "$http" >"$workdir/banner.txt" 2>>"$workdir/quickstart.log") &
    qs_pid=$!
    for _ in $(seq 600); do
        grep -q "Stop with Ctrl-C" "$workdir/banner.txt" 2>/dev/null && return
        kill -0 "$qs_pid" 2>/dev/null || break
        sleep 0.2
    done
    echo "the quickstart did not start: see $workdir/quickstart.log" >&2
    exit 1
}
rm -rf "$workdir/qs"
start_quickstart
if [ "$settings" = production ]; then
    stop_quickstart
    sed -i '/^unknown_tenant = "reveal"/d' "$workdir/qs/pgwake.toml"
    start_quickstart
fi
url=$(sed -n "s/.*const sql = neon('\(.*\)');.*/\1/p" "$workdir/banner.txt")
if [ "$role" = superuser ]; then
    url=$(python3 - "$url" "$workdir/qs/pgwake.toml" <<'EOF'
import re, sys
from urllib.parse import quote
url, config = sys.argv[1], open(sys.argv[2]).read()
value = lambda key: re.search(rf'^{key} = "(.*)"', config, re.M).group(1)
print(re.sub(r"//[^@]*@", f"//{quote(value('superuser'))}:{quote(value('password'))}@", url, 1))
EOF
)
fi
echo "settings: $settings, role: $role, gateway: $pgwake_bin"

status=0
for environment in ${environments//,/ }; do
    out="$workdir/vitest-$environment"
    (cd "$driver" &&
        VITE_NEON_DB_URL="$url" VITE_NEON_DB_POOLER_URL="$url" \
            VITE_WSPROXY="127.0.0.1:$http/v2" PGWAKE_FETCH="https://127.0.0.1:$http/sql" \
            NODE_EXTRA_CA_CERTS="$workdir/qs/ca.pem" \
            timeout 900 npx vitest run --dir=tests/cli --environment="$environment" \
            --config=tests/pgwake.config.mts --reporter=json --outputFile="$out.json" \
            >"$out.log" 2>&1) || status=1
    python3 - "$environment" "$out.json" <<'EOF'
import json, sys
environment, path = sys.argv[1], sys.argv[2]
report = json.load(open(path))
print(f"{environment}: {report['numPassedTests']} of {report['numTotalTests']} passed, "
      f"{report['numFailedTests']} failed, {report['numPendingTests']} skipped")
for test_file in report["testResults"]:
    for test in test_file["assertionResults"]:
        if test["status"] != "passed":
            message = (test.get("failureMessages") or [""])[0].split("\n")[0][:200]
            name = test_file["name"].rsplit("/", 1)[-1]
            print(f"  {test['status']} {name}: {test['fullName']}\n    {message}")
EOF
done
echo "gateway's counts from this run:"
curl -s "http://127.0.0.1:$admin/metrics" |
    grep -E '^pgwake_(auth_attempts_total|password_hashes_total)' || true
exit $status
