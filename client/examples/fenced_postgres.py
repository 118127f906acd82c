"""Write under a raftlock lock, with the fence checked by PostgreSQL itself.

Run it while holding the lock, so that the lock's name and fence are in its
environment:

    raftlock lock accounts/42 -- python3 client/examples/fenced_postgres.py

It reads RAFTLOCK_NAME and RAFTLOCK_FENCE (set by `raftlock lock`) and
DATABASE_URL (a libpq URL or key=value string), and in one transaction calls
raftlock.check_fence first, then adds 10 to account 42's balance. If a newer
holder has written already, PostgreSQL refuses the fence (SQLSTATE RL001):
the transaction is rolled back, nothing is written, and the script exits
with status 3.

Needs `pip install "psycopg[binary]"` and the schema, installed once:
`psql -v ON_ERROR_STOP=1 -f client/fenced/sql/raftlock_fence.sql "$DATABASE_URL"`.
"""

import os
import sys

import psycopg

STALE_FENCE = "RL001"


def main() -> int:
    resource = os.environ["RAFTLOCK_NAME"]
    fence = int(os.environ["RAFTLOCK_FENCE"])
    # autocommit: each `with conn.transaction()` is one BEGIN ... COMMIT.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance bigint NOT NULL)"
        )
        conn.execute("INSERT INTO accounts VALUES (42, 0) ON CONFLICT DO NOTHING")
        try:
            with conn.transaction():
                # First: it locks the resource's fence row until COMMIT, so no
                # other holder can write between this check and ours.
                conn.execute("SELECT raftlock.check_fence(%s, %s)", (resource, fence))
                (balance,) = conn.execute(
                    "SELECT balance FROM accounts WHERE id = 42"
                ).fetchone()
                conn.execute(
                    "UPDATE accounts SET balance = %s WHERE id = 42", (balance + 10,)
                )
        except psycopg.Error as e:
            if e.sqlstate == STALE_FENCE:
                # This holder lost the lock; a newer one has written. Give up.
                print(f"refused: {e.diag.message_primary} ({e.diag.message_detail})",
                      file=sys.stderr)
                return 3
            raise
    print(f"account 42: balance {balance + 10}, written with fence {fence}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
