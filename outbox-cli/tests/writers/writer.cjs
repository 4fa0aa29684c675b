// A service written in Node (pg) that uses the outbox the way the docs tell it to: the
// same protocol as writer.py, PostgreSQL only.
//
//   NODE_PATH=.../node_modules node writer.cjs URL OUTBOX_TABLE BUSINESS_TABLE TRANSACTIONS ROLLBACK_SHARE SEED
const pg = require("pg");

const [url, outbox, business] = process.argv.slice(2, 5);
const [transactions, rollbackShare, seed] = process.argv.slice(5, 8).map(Number);
const WORKERS = 4, KEYS = 10;

// A small seeded generator (mulberry32), so a failing run can be repeated.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let next = 0;
const keyTails = new Map(); // key -> promise of the last commit of that key

async function work(worker) {
  const rng = random(seed * 100 + worker);
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  while (next < transactions) {
    const n = next++;
    const key = `order-${Math.floor(rng() * KEYS)}`;
    const payload = Buffer.from(JSON.stringify({ order: n, key }));
    await client.query("BEGIN");
    await client.query(`INSERT INTO ${business} (n, status) VALUES ($1, $2)`, [n, "placed"]);
    const { rows } = await client.query(
      `SELECT ${outbox}_enqueue($1, $2, $3, partition_key => $4) AS id`,
      ["orders", "order.placed", payload, key],
    );
    const id = rows[0].id;
    await new Promise((resolve) => setTimeout(resolve, rng() * 2));
    if (rng() < rollbackShare) {
      await client.query("ROLLBACK");
      console.log(JSON.stringify({ id, key, committed: false }));
      continue;
    }
    // Commits of one key are chained, so the printed order is the commit order.
    const previous = keyTails.get(key) ?? Promise.resolve();
    const commit = previous.then(async () => {
      await client.query("COMMIT");
      console.log(JSON.stringify({ id, key, committed: true }));
    });
    keyTails.set(key, commit);
    await commit;
  }
  await client.end();
}

Promise.all(Array.from({ length: WORKERS }, (_, w) => work(w))).catch((error) => {
  console.error(error);
  process.exit(1);
});
