"""psycopg 3 with psycopg_pool: 10 pooled connections, one query per interval.

usage: psycopg_pool_app.py executemany|pipeline URL EVERY_MS QUERIES
"""

import sys
import time

from psycopg_pool import ConnectionPool

mode, url, every, queries = sys.argv[1], sys.argv[2], int(sys.argv[3]) / 1000, int(sys.argv[4])
pool = ConnectionPool(url, min_size=10, max_size=10, max_idle=3600, open=True)
pool.wait()
with pool.connection() as conn:
    conn.execute("create table if not exists fidelity (x int)")
print("ready", flush=True)
start = time.monotonic()
for i in range(queries):
    time.sleep(max(0.0, start + every / 2 + i * every - time.monotonic()))
    with pool.connection() as conn:
        if mode == "executemany":
            conn.cursor().executemany("insert into fidelity values (%s)", [(i,), (i + 1,)])
        else:
            with conn.pipeline():
                conn.execute("select %s::int", (i,))
                conn.execute("select count(*) from fidelity")
    print(f"query {i}", flush=True)
time.sleep(max(0.0, start + queries * every - time.monotonic()))
pool.close()
print("done", flush=True)
