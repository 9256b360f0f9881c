"""asyncpg with its pool: 10 pooled connections, one query per interval.

usage: asyncpg_pool_app.py URL EVERY_MS QUERIES
"""

import asyncio
import sys
import time


async def main():
    import asyncpg

    url, every, queries = sys.argv[1], int(sys.argv[2]) / 1000, int(sys.argv[3])
    pool = await asyncpg.create_pool(
        url, min_size=10, max_size=10, max_inactive_connection_lifetime=0
    )
    print("ready", flush=True)
    start = time.monotonic()
    for i in range(queries):
        await asyncio.sleep(max(0.0, start + every / 2 + i * every - time.monotonic()))
        async with pool.acquire() as conn:
            await conn.fetchval("select $1::int + 1", i)
        print(f"query {i}", flush=True)
    await asyncio.sleep(max(0.0, start + queries * every - time.monotonic()))
    await pool.close()
    print("done", flush=True)


asyncio.run(main())
