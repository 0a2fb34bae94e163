-- stats.lua: a consistent snapshot of the store for monitoring.
-- KEYS[1] due        ZSET id -> score
-- KEYS[2] inflight   ZSET id -> lease deadline
-- KEYS[3] dead       ZSET id -> dead-lettered at
-- KEYS[4] stats      HASH counters
-- KEYS[5] promoters  ZSET promoter id -> last heartbeat
-- ARGV[1] heartbeat window ms (a promoter seen within it counts as live)
-- ARGV[2..] histogram edges, ms from now, ascending: counts messages due in [now, now+e1), [e1, e2), ...
-- Returns {now_ms, parked, inflight, dead, overdue, head_due_ms or -1, live promoters,
--          {counter, value, ...}, {bucket counts..., count past the last edge}}.

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset')
if problem then
    return problem
end

local now = now_ms()
local window = tonumber(ARGV[1])
-- Promoters silent for a day are gone for good; forget them so the set does not grow without bound.
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - 86400000)
local head = head_due(KEYS[1])
local buckets = {}
local low = due_limit(now)
for i = 2, #ARGV do
    local high = due_limit(now + tonumber(ARGV[i]))
    -- string.format, not '..': Lua's own number-to-string keeps only 14 digits and scores need 16.
    buckets[#buckets + 1] = redis.call('ZCOUNT', KEYS[1], string.format('(%d', low), high)
    low = high
end
buckets[#buckets + 1] = redis.call('ZCOUNT', KEYS[1], string.format('(%d', low), '+inf')
return {
    now,
    redis.call('ZCARD', KEYS[1]),
    redis.call('ZCARD', KEYS[2]),
    redis.call('ZCARD', KEYS[3]),
    redis.call('ZCOUNT', KEYS[1], '-inf', due_limit(now)),
    head or -1,
    redis.call('ZCOUNT', KEYS[5], now - window, '+inf'),
    redis.call('HGETALL', KEYS[4]),
    buckets,
}
