"""A service written in Python that uses the outbox the way the docs tell it to.

Each business transaction inserts an order row and enqueues one message with the
one-statement enqueue, then commits or (for a share of them) rolls back. Several threads
write at once, over a few partition keys. One JSON line per transaction goes to stdout:
{"id": ..., "key": ..., "committed": true|false}; committed lines of one key are printed
in the order their transactions committed. A transaction the database rolls back for a
deadlock or a lock wait timeout is retried whole; a writer thread that fails fails the run.

    writer.py postgres|mysql URL OUTBOX_TABLE BUSINESS_TABLE TRANSACTIONS ROLLBACK_SHARE SEED
"""
import json
import random
import sys
import threading
import time
from urllib.parse import unquote, urlsplit

dialect, url, outbox, business = sys.argv[1:5]
transactions, rollback_share, seed = int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
THREADS, KEYS = 4, 10


def connect():
    if dialect == "postgres":
        import psycopg

        return psycopg.connect(url)
    import pymysql

    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/"),
        autocommit=False,
    )


def enqueue(cur, key, payload):
    """The one statement a writer needs; returns the new message id."""
    if dialect == "postgres":
        cur.execute(
            f"SELECT {outbox}_enqueue(%s, %s, %s, partition_key => %s)",
            ("orders", "order.placed", payload, key),
        )
    else:
        cur.execute(
            f"CALL {outbox}_enqueue(%s, %s, %s, %s, NULL, NULL)",
            ("orders", "order.placed", payload, key),
        )
    (message_id,) = cur.fetchone()
    while dialect == "mysql" and cur.nextset():
        pass
    return str(message_id)


counter = iter(range(transactions))
counter_lock, print_lock = threading.Lock(), threading.Lock()
key_locks = {f"order-{k}": threading.Lock() for k in range(KEYS)}


def transient(error):
    """A deadlock or lock wait timeout: the database rolled the transaction back, and a
    service retries the whole transaction, as the docs say."""
    if dialect == "postgres":
        return getattr(error, "sqlstate", None) in ("40001", "40P01")
    return bool(error.args) and error.args[0] in (1205, 1213)


def transaction(conn, rng, n, key):
    """One business transaction; True if it committed, False if it rolled back."""
    payload = json.dumps({"order": n, "key": key}).encode()
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {business} (n, status) VALUES (%s, %s)", (n, "placed"))
        message_id = enqueue(cur, key, payload)
    time.sleep(rng.random() / 500)
    if rng.random() < rollback_share:
        conn.rollback()
        with print_lock:
            print(json.dumps({"id": message_id, "key": key, "committed": False}), flush=True)
        return
    # Holding the key's lock across COMMIT makes the printed order the commit order.
    with key_locks[key]:
        conn.commit()
        with print_lock:
            print(json.dumps({"id": message_id, "key": key, "committed": True}), flush=True)


def work(thread):
    rng = random.Random(seed * 100 + thread)
    conn = connect()
    while True:
        with counter_lock:
            n = next(counter, None)
        if n is None:
            break
        key = f"order-{rng.randrange(KEYS)}"
        for attempt in range(20):
            try:
                transaction(conn, rng, n, key)
                break
            except Exception as error:
                if not transient(error) or attempt == 19:
                    raise
                conn.rollback()
    conn.close()


failed = []


def guarded(thread):
    try:
        work(thread)
    except BaseException as error:
        failed.append(f"writer thread {thread}: {error!r}")


threads = [threading.Thread(target=guarded, args=(t,)) for t in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if failed:
    # A thread that died must fail the run, not leave lines missing.
    print("\n".join(failed), file=sys.stderr)
    sys.exit(1)
