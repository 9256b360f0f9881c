// Drives the real @neondatabase/serverless driver against a pgwake gateway on localhost.
// Run by proxy/tests/serverless.rs with PGWAKE_HTTP (host:port of the HTTP listener),
// PGWAKE_URL (a connection string naming the tenant by host), PGWAKE_BAD_URL (the same with
// a wrong password) and optionally PGWAKE_HTTPS (a host:port name the TLS certificate holds). Prints one line per check and exits non-zero on the first failure.

import assert from 'node:assert/strict';
import { neon, neonConfig, Pool, Client } from '@neondatabase/serverless';
import ws from 'ws';

const http = process.env.PGWAKE_HTTP;
const url = process.env.PGWAKE_URL;
const badUrl = process.env.PGWAKE_BAD_URL;

// Plain localhost: no TLS, the gateway's own HTTP listener for both modes.
neonConfig.webSocketConstructor = ws;
neonConfig.useSecureWebSocket = false;
neonConfig.wsProxy = (host, port) => `${http}/v2?address=${host}:${port}`;
neonConfig.fetchEndpoint = () => `http://${http}/sql`;

const step = (name) => console.log(`ok ${name}`);

const sql = neon(url);

// The tenant is asleep: this first query wakes it.
const [first] = await sql`SELECT 1 AS one`;
assert.equal(first.one, 1);
step('http query woke the tenant');

const n = 41;
const rows = await sql`SELECT ${n}::int + 1 AS answer, ${'pg'}::text || 'wake' AS name, now() AS at`;
assert.equal(rows[0].answer, 42);
assert.equal(rows[0].name, 'pgwake');
assert.ok(rows[0].at instanceof Date);
step('http tagged template with parameters');

const viaQuery = await sql.query('SELECT $1::int8 AS big, $2::bool AS yes, $3::text AS nothing', [
  '9007199254740993',
  true,
  null,
]);
assert.equal(viaQuery[0].big, '9007199254740993');
assert.equal(viaQuery[0].yes, true);
assert.equal(viaQuery[0].nothing, null);
step('http sql.query with parameters');

const full = await sql.query('SELECT generate_series(1, 3) AS i', [], { fullResults: true });
assert.equal(full.rowCount, 3);
assert.equal(full.command, 'SELECT');
assert.deepEqual(full.fields.map((f) => f.name), ['i']);
step('http full results');

await sql`CREATE TABLE IF NOT EXISTS driver_items (id int PRIMARY KEY, name text)`;
await sql`TRUNCATE driver_items`;
const [inserted, counted] = await sql.transaction(
  [
    sql`INSERT INTO driver_items VALUES (1, 'a'), (2, 'b')`,
    sql`SELECT count(*)::int AS c FROM driver_items`,
  ],
  { isolationLevel: 'Serializable' },
);
assert.deepEqual(inserted, []);
assert.equal(counted[0].c, 2);
step('http transaction batch');

// A failing batch rolls back as a whole.
await assert.rejects(
  sql.transaction([sql`INSERT INTO driver_items VALUES (3, 'c')`, sql`SELECT 1/0`]),
  (err) => err.code === '22012',
);
const [after] = await sql`SELECT count(*)::int AS c FROM driver_items`;
assert.equal(after.c, 2);
step('http failed transaction rolled back');

await assert.rejects(sql`SELEC 1`, (err) => {
  assert.equal(err.name, 'NeonDbError');
  assert.equal(err.code, '42601');
  assert.equal(err.position, '1');
  return true;
});
step('http syntax error has code 42601 and a position');

await assert.rejects(neon(badUrl)`SELECT 1`, (err) => {
  assert.equal(err.code, '28P01');
  assert.match(err.message, /password authentication failed/);
  return true;
});
step('http wrong password is an auth error');

// WebSocket: Pool and Client with the default pipelined connect.
const pool = new Pool({ connectionString: url });
const { rows: poolRows } = await pool.query('SELECT $1::text AS greeting, pg_backend_pid() AS pid', [
  'hello',
]);
assert.equal(poolRows[0].greeting, 'hello');
const counts = await Promise.all(
  [1, 2, 3, 4].map((i) => pool.query('SELECT $1::int * 2 AS doubled', [i])),
);
assert.deepEqual(
  counts.map((r) => r.rows[0].doubled),
  [2, 4, 6, 8],
);
await assert.rejects(pool.query('SELEC 1'), (err) => err.code === '42601' && err.position === '1');
await pool.end();
step('websocket pool queries');

const client = new Client(url);
await client.connect();
await client.query('BEGIN');
await client.query("INSERT INTO driver_items VALUES (10, 'ws')");
const { rows: inTx } = await client.query('SELECT count(*)::int AS c FROM driver_items');
assert.equal(inTx[0].c, 3);
await client.query('ROLLBACK');
const { rows: mine } = await client.query('SELECT current_setting($1) AS app', ['application_name']);
assert.equal(typeof mine[0].app, 'string');
await client.end();
step('websocket client transaction');

// With the pipelined connect, connect() resolves before the server answered; the refusal
// surfaces on the first query.
const badClient = new Client(badUrl);
badClient.on('error', () => {});
await assert.rejects(
  (async () => {
    await badClient.connect();
    await badClient.query('SELECT 1');
  })(),
  (err) => {
    assert.equal(err.code, '28P01');
    assert.match(err.message, /password authentication failed/);
    return true;
  },
);
step('websocket wrong password is an auth error');

// The same over TLS (HTTPS and wss), when the test gives a name the certificate holds.
const https = process.env.PGWAKE_HTTPS;
if (https) {
  neonConfig.fetchEndpoint = () => `https://${https}/sql`;
  neonConfig.useSecureWebSocket = true;
  neonConfig.wsProxy = (host, port) => `${https}/v2?address=${host}:${port}`;
  const [tls] = await neon(url)`SELECT 'tls' AS via`;
  assert.equal(tls.via, 'tls');
  const tlsPool = new Pool({ connectionString: url });
  const { rows: wss } = await tlsPool.query('SELECT $1::text AS via', ['wss']);
  assert.equal(wss[0].via, 'wss');
  await tlsPool.end();
  step('https and wss');
}

console.log('all checks passed');
