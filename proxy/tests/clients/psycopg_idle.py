"""A psycopg 3 application that goes quiet after its last query (run by sleep_fidelity.rs).

usage: psycopg_idle.py CONNINFO executemany|pipeline

Prints the wall-clock time (seconds since the epoch) its last query finished, then waits for a
line on stdin and runs one more query on the same connection, printing its answer.
"""

import sys
import time

import psycopg

conninfo, mode = sys.argv[1], sys.argv[2]
conn = psycopg.connect(conninfo)
cur = conn.cursor()
cur.execute("create table if not exists t (x int)")
conn.commit()
if mode == "executemany":
    # executemany runs in a pipeline that ends with Sync then Flush.
    cur.executemany("insert into t values (%s)", [(1,), (2,)])
    conn.commit()
elif mode == "pipeline":
    conn.autocommit = True
    with conn.pipeline():
        pass
    cur.execute("select 1")
    cur.fetchall()
else:
    sys.exit(f"unknown mode {mode}")
print(time.time(), flush=True)
sys.stdin.readline()
cur.execute("select count(*) from t")
print(cur.fetchone()[0], flush=True)
conn.close()
