// Drizzle ORM on node-postgres, for the app zoo: a pg.Pool of its default ten connections, the
// schema from a migration folder (as drizzle-kit writes one) applied by Drizzle's migrator, and
// each step of the flow in `db.transaction`.
//
// usage: node app.mjs URL
//
// The line protocol is the zoo's (see ../zoo_protocol.py): `ready N`, then per `step` the
// step's `out ...` lines and `ok`; `quit` ends the pool and prints `done`.
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { asc, count, eq, sql, sum } from "drizzle-orm";
import { drizzle } from "drizzle-orm/node-postgres";
import { migrate } from "drizzle-orm/node-postgres/migrator";
import { integer, pgTable, serial, text } from "drizzle-orm/pg-core";
import pg from "pg";

const author = pgTable("author", {
  id: serial("id").primaryKey(),
  name: text("name").notNull(),
});
const book = pgTable("book", {
  id: integer("id").primaryKey().generatedAlwaysAsIdentity(),
  authorId: integer("author_id")
    .notNull()
    .references(() => author.id),
  title: text("title").notNull(),
  copies: integer("copies").notNull(),
});

// pg.Pool's default idleTimeoutMillis (10 s) closes idle clients; 0 keeps them, as an
// application that holds its pool open does. Everything else is the default (max 10).
const pool = new pg.Pool({ connectionString: process.argv[2], idleTimeoutMillis: 0 });
const db = drizzle({ client: pool });
await migrate(db, { migrationsFolder: fileURLToPath(new URL("migrations", import.meta.url)) });
// Open the whole pool: its clients checked out at once, then released.
const size = pool.options.max;
const clients = await Promise.all(Array.from({ length: size }, () => pool.connect()));
for (const c of clients) c.release();

const rows = async (tx) => {
  const all = await tx
    .select({ id: book.id, name: author.name, title: book.title, copies: book.copies })
    .from(book)
    .innerJoin(author, eq(book.authorId, author.id))
    .orderBy(asc(book.id));
  return all.map((r) => `row ${r.id} ${r.name} ${r.title} ${r.copies}`);
};
const bookLine = (b) => `book ${b.id} ${b.authorId} ${b.title} ${b.copies}`;

const steps = [
  async (tx) => {
    const [ada, brian] = await tx.insert(author).values([{ name: "Ada" }, { name: "Brian" }]).returning();
    const books = await tx
      .insert(book)
      .values([
        { authorId: ada.id, title: "Notes", copies: 3 },
        { authorId: ada.id, title: "Engines", copies: 1 },
        { authorId: brian.id, title: "C", copies: 2 },
      ])
      .returning();
    return [`author ${ada.id} ${ada.name}`, `author ${brian.id} ${brian.name}`, ...books.map(bookLine)];
  },
  rows,
  async (tx) => {
    const [ada] = await tx.select().from(author).where(eq(author.name, "Ada"));
    const updated = await tx
      .update(book)
      .set({ copies: sql`${book.copies} + 1` })
      .where(eq(book.authorId, ada.id))
      .returning();
    updated.sort((a, b) => a.id - b.id);
    return [`updated ${updated.length}`, ...updated.map((b) => `book ${b.id} ${b.copies}`)];
  },
  async (tx) => {
    const [grace] = await tx.insert(author).values({ name: "Grace" }).returning();
    const [b] = await tx.insert(book).values({ authorId: grace.id, title: "Compilers", copies: 5 }).returning();
    return [`author ${grace.id} ${grace.name}`, bookLine(b)];
  },
  async (tx) => {
    const deleted = await tx.delete(book).where(eq(book.title, "Engines")).returning({ id: book.id });
    return deleted.map((b) => `deleted ${b.id}`);
  },
  async (tx) => {
    const [{ authors }] = await tx.select({ authors: count() }).from(author);
    const [{ books, copies }] = await tx.select({ books: count(), copies: sum(book.copies) }).from(book);
    return [`authors ${authors} books ${books} copies ${copies ?? 0}`, ...(await rows(tx))];
  },
];

console.log(`ready ${size}`);
let done = 0;
for await (const line of createInterface({ input: process.stdin })) {
  const command = line.trim();
  if (command === "quit") break;
  if (command !== "step" || done === steps.length) {
    throw new Error(`unexpected command ${JSON.stringify(command)} after ${done} steps`);
  }
  const out = await db.transaction((tx) => steps[done](tx));
  for (const l of out) console.log(`out ${l}`);
  done += 1;
  console.log("ok");
}
await pool.end();
console.log("done");
