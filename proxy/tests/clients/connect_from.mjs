// Connects with a connection string exactly as given and prints the database the session is in
// (run by proxy/tests/quickstart.rs to check the strings the quickstart prints).
//
// usage: node connect_from.mjs pg|postgres URL
//
// Prints `ok DATABASE`, or `error CODE MESSAGE` when the driver refuses; exits 0 either way so
// the caller decides which outcome a string should have.
import pg from "pg";
import postgres from "postgres";

const [driver, url] = process.argv.slice(2);
try {
  let db;
  if (driver === "pg") {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    db = (await client.query("select current_database() as db")).rows[0].db;
    await client.end();
  } else if (driver === "postgres") {
    const sql = postgres(url, { max: 1, onnotice: () => {} });
    db = (await sql`select current_database() as db`)[0].db;
    await sql.end();
  } else {
    throw new Error(`unknown driver ${driver}`);
  }
  console.log(`ok ${db}`);
} catch (e) {
  console.log(`error ${e.code ?? "-"} ${e.message}`);
}
process.exit(0);
