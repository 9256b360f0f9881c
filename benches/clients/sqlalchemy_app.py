"""SQLAlchemy 2 on psycopg 3: a pool of 10 connections, one query per interval.

usage: sqlalchemy_app.py [serial] URL EVERY_MS QUERIES

With `serial`, each query inserts into a table whose key is a serial column, as an ORM's
models do, so the connection draws from a sequence.
"""

import sys
import time

from sqlalchemy import create_engine, text

args = sys.argv[1:]
serial = args[0] == "serial"
if serial:
    args = args[1:]
url, every, queries = args[0], int(args[1]) / 1000, int(args[2])
table = "fidelity_serial" if serial else "fidelity"
columns = "id serial primary key, x int" if serial else "x int"
engine = create_engine(
    url.replace("postgres://", "postgresql+psycopg://", 1),
    pool_size=10,
    max_overflow=0,
    pool_recycle=-1,
)
# Fill the pool: ten connections checked out at once, then returned (each is rolled back).
held = [engine.connect() for _ in range(10)]
held[0].execute(text(f"create table if not exists {table} ({columns})"))
held[0].commit()
for c in held:
    c.close()
print("ready", flush=True)
start = time.monotonic()
for i in range(queries):
    time.sleep(max(0.0, start + every / 2 + i * every - time.monotonic()))
    with engine.connect() as conn:
        conn.execute(text(f"insert into {table} (x) values (:x)"), {"x": i})
        conn.execute(text(f"select count(*) from {table}")).scalar_one()
        conn.commit()
    print(f"query {i}", flush=True)
time.sleep(max(0.0, start + queries * every - time.monotonic()))
engine.dispose()
print("done", flush=True)
