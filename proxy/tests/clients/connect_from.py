"""Connects with a connection string exactly as given and prints the database the session is in
(run by proxy/tests/quickstart.rs to check the strings the quickstart prints).

usage: connect_from.py psycopg|asyncpg URL

Prints `ok DATABASE`, or `error MESSAGE` when the driver refuses; exits 0 either way.
"""

import asyncio
import sys

driver, url = sys.argv[1], sys.argv[2]


async def with_asyncpg():
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("select current_database()")
    finally:
        await conn.close()


def with_psycopg():
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("select current_database()").fetchone()[0]


try:
    if driver == "psycopg":
        db = with_psycopg()
    elif driver == "asyncpg":
        db = asyncio.run(with_asyncpg())
    else:
        sys.exit(f"unknown driver {driver}")
    print(f"ok {db}")
except Exception as e:  # the caller checks which strings must fail
    print(f"error {type(e).__name__}: {e}".replace("\n", " "))
