// A node-postgres application that pauses before its last query, then goes quiet (run by
// sleep_fidelity.rs).
//
// usage: node pg_idle.mjs PORT USER PASSWORD DATABASE PAUSE_MS
//
// Prints the wall-clock time (seconds since the epoch) its last query finished, then waits for
// a line on stdin and runs one more query on the same connection, printing its answer.
import readline from "node:readline";
import pg from "pg";

const [port, user, password, database, pauseMs] = process.argv.slice(2);
const client = new pg.Client({ host: "127.0.0.1", port: Number(port), user, password, database });
await client.connect();
await client.query("select $1::int as n", [1]);
await new Promise((r) => setTimeout(r, Number(pauseMs)));
await client.query("select $1::int as n", [2]);
console.log(String(Date.now() / 1000));
const lines = readline.createInterface({ input: process.stdin });
for await (const _ of lines) {
  break;
}
const { rows } = await client.query("select $1::int + 1 as n", [41]);
console.log(String(rows[0].n));
await client.end();
process.exit(0);
