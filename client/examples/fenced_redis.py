"""Write a Redis key under a raftlock lock, with the fence checked by Redis.

    raftlock lock accounts/42 -- python3 client/examples/fenced_redis.py VALUE

It reads RAFTLOCK_NAME and RAFTLOCK_FENCE (set by `raftlock lock`) and
REDIS_URL, and sets the key named like the lock to VALUE through
client/fenced/lua/fenced_write.lua: Redis runs the script by its SHA1 (redis-py
loads it again when the server answers NOSCRIPT) and refuses a fence smaller
than the one kept at KEY:raftlock-fence. A refusal is an error reply that
starts with STALEFENCE; nothing is written, and the script exits with status 3.

Needs `pip install redis`.
"""

import os
import pathlib
import sys

import redis

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "fenced" / "lua" / "fenced_write.lua"


def main() -> int:
    key = os.environ["RAFTLOCK_NAME"]
    fence = int(os.environ["RAFTLOCK_FENCE"])
    value = sys.argv[1]
    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    fenced_write = r.register_script(SCRIPT.read_text())
    try:
        fenced_write(keys=[key, key + ":raftlock-fence"], args=[fence, "set", value])
    except redis.ResponseError as e:
        if str(e).startswith("STALEFENCE"):
            # This holder lost the lock; a newer one has written. Give up.
            print(f"refused: {e}", file=sys.stderr)
            return 3
        raise
    print(f"{key} = {value}, written with fence {fence}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
