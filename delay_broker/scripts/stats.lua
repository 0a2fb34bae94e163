-- stats.lua: a consistent snapshot of the store for monitoring.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   STATS     HASH counters
--   PROMOTERS ZSET promoter id -> last heartbeat
--   MOVED     ZSET far-tier token -> when its message was moved in
-- ARGV[1] heartbeat window ms (a promoter seen within it counts as live)
-- ARGV[2..] histogram edges, ms from now, ascending: counts messages due in [now, now+e1), [e1, e2), ...
-- Returns {now_ms, parked, inflight, dead, overdue, head_due_ms or -1, live promoters,
--          {counter, value, ...}, {bucket counts..., count past the last edge}, {moved tokens}}: the tokens
--          of far-tier rows moved in whose delete may not be committed yet, read with the counts so that a
--          caller counting the far tier too can leave those rows to Redis.

local problem = wrong_type(DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', STATS, 'hash', PROMOTERS, 'zset',
    MOVED, 'zset')
if problem then
    return problem
end

local now = now_ms()
local window = tonumber(ARGV[1])
-- Promoters silent for a day are gone for good; forget them so the set does not grow without bound.
redis.call('ZREMRANGEBYSCORE', PROMOTERS, '-inf', now - 86400000)
local head = head_due(DUE)
local buckets = {}
local low = due_limit(now)
for i = 2, #ARGV do
    local high = due_limit(now + tonumber(ARGV[i]))
    -- string.format, not '..': Lua's own number-to-string keeps only 14 digits and scores need 16.
    buckets[#buckets + 1] = redis.call('ZCOUNT', DUE, string.format('(%d', low), high)
    low = high
end
buckets[#buckets + 1] = redis.call('ZCOUNT', DUE, string.format('(%d', low), '+inf')
return {
    now,
    redis.call('ZCARD', DUE),
    redis.call('ZCARD', INFLIGHT),
    redis.call('ZCARD', DEAD),
    redis.call('ZCOUNT', DUE, '-inf', due_limit(now)),
    head or -1,
    redis.call('ZCOUNT', PROMOTERS, now - window, '+inf'),
    redis.call('HGETALL', STATS),
    buckets,
    redis.call('ZRANGE', MOVED, 0, -1),
}
