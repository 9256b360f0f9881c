// node-postgres with pg.Pool: 10 pooled connections, one query per interval.
//
// usage: node pg_pool_app.mjs URL EVERY_MS QUERIES
import pg from "pg";

const [url, everyMs, queries] = process.argv.slice(2).map((a, i) => (i === 0 ? a : Number(a)));
// idleTimeoutMillis 0 keeps idle clients open, as an application that holds its pool does.
const pool = new pg.Pool({ connectionString: url, max: 10, idleTimeoutMillis: 0 });
const clients = await Promise.all(Array.from({ length: 10 }, () => pool.connect()));
for (const c of clients) {
  await c.query("select 1");
  c.release();
}
console.log("ready");
const start = Date.now();
const sleepUntil = (t) => new Promise((r) => setTimeout(r, Math.max(0, t - Date.now())));
for (let i = 0; i < queries; i++) {
  await sleepUntil(start + everyMs / 2 + i * everyMs);
  await pool.query("select $1::int + 1 as n", [i]);
  console.log(`query ${i}`);
}
await sleepUntil(start + queries * everyMs);
await pool.end();
console.log("done");
