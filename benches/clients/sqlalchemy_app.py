"""SQLAlchemy 2 on psycopg 3: a pool of 10 connections, one query per interval.

usage: sqlalchemy_app.py URL EVERY_MS QUERIES

The ORM, with inserts into serial and identity keys, is the app zoo's (zoo/sqlalchemy_orm.py).
"""

import sys
import time

from sqlalchemy import create_engine, text

url, every, queries = sys.argv[1], int(sys.argv[2]) / 1000, int(sys.argv[3])
engine = create_engine(
    url.replace("postgres://", "postgresql+psycopg://", 1),
    pool_size=10,
    max_overflow=0,
    pool_recycle=-1,
)
# Fill the pool: ten connections checked out at once, then returned (each is rolled back).
held = [engine.connect() for _ in range(10)]
held[0].execute(text("create table if not exists fidelity (x int)"))
held[0].commit()
for c in held:
    c.close()
print("ready", flush=True)
start = time.monotonic()
for i in range(queries):
    time.sleep(max(0.0, start + every / 2 + i * every - time.monotonic()))
    with engine.connect() as conn:
        conn.execute(text("insert into fidelity (x) values (:x)"), {"x": i})
        conn.execute(text("select count(*) from fidelity")).scalar_one()
        conn.commit()
    print(f"query {i}", flush=True)
time.sleep(max(0.0, start + queries * every - time.monotonic()))
engine.dispose()
print("done", flush=True)
