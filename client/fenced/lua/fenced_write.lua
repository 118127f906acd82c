-- raftlock fenced operation for Redis — script version 1.
--
-- Load it once (SCRIPT LOAD) and run it by its SHA1 (EVALSHA); after a
-- NOSCRIPT reply (the server restarted or its script cache was flushed)
-- load it again and repeat the call.
--
--   EVALSHA sha 2 KEY FENCE_KEY FENCE OP [ARG ...]
--
--   KEY        the data key
--   FENCE_KEY  where the largest fence accepted for KEY is kept, as a
--              decimal string (the Rust helper uses KEY .. ':raftlock-fence').
--              On Redis Cluster the two must share a slot: give KEY a hash
--              tag, e.g. '{account:42}', and the suffixed name keeps it.
--   FENCE      the holder's fencing token: a decimal integer from 1 to
--              9223372036854775807 (2^63 - 1, raftlock's fence bound).
--   OP ARG...  set VALUE | get | del | hset FIELD VALUE [FIELD VALUE ...] | hgetall
--
-- If FENCE is at least the one kept at FENCE_KEY (or none is kept), it runs
-- OP on KEY, keeps FENCE at FENCE_KEY and returns OP's own reply (OK, the
-- value or nil, the number deleted, the number of new fields, the fields
-- and values). Reads record the fence too, so a holder that read before a
-- newer holder cannot write back what it computed from that read.
--
-- A smaller FENCE is refused with an error reply that starts with the code
-- STALEFENCE followed by the largest accepted fence:
--   STALEFENCE 7 stale fence 5 for account:42: fence 7 was already accepted
-- Bad arguments get an error reply that starts with "ERR raftlock:". Either
-- way nothing is changed. If OP itself fails (e.g. hset on a key holding a
-- string: WRONGTYPE) the fence is not recorded and nothing is changed.
--
-- A fenced del removes KEY but keeps FENCE_KEY: the fence must outlive the
-- data, or a stale holder could write the key again. Delete FENCE_KEY only
-- when no holder of the lock can still write.

local MAX = '9223372036854775807'

-- Redis' Lua numbers are doubles, exact only up to 2^53: fences are
-- compared as decimal strings (no leading zeros: longer is larger, and
-- equal lengths compare as text).
local function is_fence(f)
    return type(f) == 'string' and string.match(f, '^[1-9]%d*$') ~= nil
        and (#f < #MAX or (#f == #MAX and f <= MAX))
end

local function smaller(a, b)
    if #a ~= #b then
        return #a < #b
    end
    return a < b
end

if #KEYS ~= 2 then
    return redis.error_reply('ERR raftlock: pass two keys, the data key and its fence key')
end
local fence = ARGV[1]
if not is_fence(fence) then
    return redis.error_reply('ERR raftlock: a fence is a decimal integer from 1 to ' .. MAX
        .. ', got ' .. tostring(fence))
end
local op = ARGV[2]
local args = #ARGV - 2
if op == 'set' then
    if args ~= 1 then
        return redis.error_reply('ERR raftlock: set takes one value')
    end
elseif op == 'get' or op == 'del' or op == 'hgetall' then
    if args ~= 0 then
        return redis.error_reply('ERR raftlock: ' .. op .. ' takes no arguments')
    end
elseif op == 'hset' then
    if args < 2 or args % 2 ~= 0 then
        return redis.error_reply('ERR raftlock: hset takes field value pairs')
    end
else
    return redis.error_reply('ERR raftlock: unknown operation ' .. tostring(op)
        .. ' (set, get, del, hset, hgetall)')
end

local latest = redis.call('GET', KEYS[2])
if latest then
    if not is_fence(latest) then
        return redis.error_reply('ERR raftlock: the fence key ' .. KEYS[2] .. ' holds '
            .. latest .. ', not a fence')
    end
    if smaller(fence, latest) then
        return redis.error_reply('STALEFENCE ' .. latest .. ' stale fence ' .. fence .. ' for '
            .. KEYS[1] .. ': fence ' .. latest .. ' was already accepted')
    end
end

-- The operation first: if it fails, nothing has been written.
local reply
if op == 'set' then
    reply = redis.call('SET', KEYS[1], ARGV[3])
elseif op == 'get' then
    reply = redis.call('GET', KEYS[1])
elseif op == 'del' then
    reply = redis.call('DEL', KEYS[1])
elseif op == 'hset' then
    reply = redis.call('HSET', KEYS[1], unpack(ARGV, 3))
else
    reply = redis.call('HGETALL', KEYS[1])
end
if latest ~= fence then
    redis.call('SET', KEYS[2], fence)
end
return reply
