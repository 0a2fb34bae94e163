-- stats.lua: a consistent snapshot of the store for monitoring.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   STATS     HASH counters
--   PROMOTERS ZSET promoter id -> last heartbeat
--   MOVED     ZSET far-tier token -> when its message was moved in
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_LIVE HASH pack name -> messages packed in it
-- ARGV[1] heartbeat window ms (a promoter seen within it counts as live)
-- ARGV[2..] histogram edges, ms from now, ascending: counts messages due in [now, now+e1), [e1, e2), ...
-- Returns {now_ms, parked, inflight, dead, overdue, head_due_ms or -1, live promoters,
--          {counter, value, ...}, {bucket counts..., count past the last edge}, {moved tokens}, packed}: the
--          tokens of far-tier rows moved in whose delete may not be committed yet, read with the counts so that
--          a caller counting the far tier too can leave those rows to Redis. Packed messages are counted in
--          parked (and apart), in the histogram by their pack's earliest due time (a pack spans at most a
--          sixteenth of its distance), and as overdue when that time has passed; a pack that PACKS does not
--          list (damage) by the start of its time slot.

local problem = wrong_type(DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', STATS, 'hash', PROMOTERS, 'zset',
    MOVED, 'zset', PACKS, 'zset', PACK_LIVE, 'hash')
if problem then
    return problem
end

local now = now_ms()
local window = tonumber(ARGV[1])
-- Promoters silent for a day are gone for good; forget them so the set does not grow without bound.
redis.call('ZREMRANGEBYSCORE', PROMOTERS, '-inf', now - 86400000)
local head = head_due(DUE)
local buckets = {}
local edges = {}
local low = due_limit(now)
for i = 2, #ARGV do
    local high = due_limit(now + tonumber(ARGV[i]))
    edges[#edges + 1] = now + tonumber(ARGV[i])
    -- string.format, not '..': Lua's own number-to-string keeps only 14 digits and scores need 16.
    buckets[#buckets + 1] = redis.call('ZCOUNT', DUE, string.format('(%d', low), high)
    low = high
end
buckets[#buckets + 1] = redis.call('ZCOUNT', DUE, string.format('(%d', low), '+inf')
local parked = redis.call('ZCARD', DUE)
local overdue = redis.call('ZCOUNT', DUE, '-inf', due_limit(now))

local packed = 0
local earliest = {}
local packs = redis.call('ZRANGE', PACKS, 0, -1, 'WITHSCORES')
for i = 1, #packs, 2 do
    earliest[packs[i]] = tonumber(packs[i + 1])
end
local lives = redis.call('HGETALL', PACK_LIVE)
for i = 1, #lives, 2 do
    local live, due = tonumber(lives[i + 1]) or 0, earliest[lives[i]]
    if live > 0 and not due then
        -- A pack PACKS no longer lists (damage; promoters list it again: pack_audit.lua): due from its slot on.
        local width, slot = string.match(lives[i], '^(%d+):(%d+)$')
        due = width and tonumber(width) * tonumber(slot) or now
    end
    if live > 0 then
        packed = packed + live
        if due <= now then
            overdue = overdue + live
        else
            local bucket = #edges + 1
            for n, edge in ipairs(edges) do
                if due <= edge then
                    bucket = n
                    break
                end
            end
            buckets[bucket] = buckets[bucket] + live
        end
        if not head or due < head then
            head = due
        end
    end
end
return {
    now,
    parked + packed,
    redis.call('ZCARD', INFLIGHT),
    redis.call('ZCARD', DEAD),
    overdue,
    head or -1,
    redis.call('ZCOUNT', PROMOTERS, now - window, '+inf'),
    redis.call('HGETALL', STATS),
    buckets,
    redis.call('ZRANGE', MOVED, 0, -1),
    packed,
}
