// Runs the serverless-driver snippet the quickstart prints, as printed: neon() over HTTP, the
// same through drizzle, and a Pool over WebSocket (run by proxy/tests/quickstart.rs; Node must
// trust the quickstart's CA through NODE_EXTRA_CA_CERTS).
//
// usage: node connect_from.mjs FETCH_ENDPOINT WS_PROXY URL
//
// Prints one `ok ...` line per check and exits non-zero on the first failure.
import assert from "node:assert/strict";
import { neon, neonConfig, Pool } from "@neondatabase/serverless";
import { drizzle } from "drizzle-orm/neon-http";
import { sql as raw } from "drizzle-orm";
import ws from "ws";

const [fetchEndpoint, wsProxy, url] = process.argv.slice(2);
neonConfig.webSocketConstructor = ws;
neonConfig.fetchEndpoint = () => fetchEndpoint;
neonConfig.wsProxy = () => wsProxy;

const sql = neon(url);
const [row] = await sql`select ${41}::int + 1 as n, current_database() as db`;
assert.equal(row.n, 42);
console.log(`ok http ${row.db}`);

const db = drizzle(sql);
const result = await db.execute(raw`select ${"drizzle"}::text as who`);
assert.equal(result.rows[0].who, "drizzle");
console.log("ok drizzle");

const pool = new Pool({ connectionString: url });
const { rows } = await pool.query("select current_database() as db");
console.log(`ok websocket ${rows[0].db}`);
await pool.end();
