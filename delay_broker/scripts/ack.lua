-- ack.lua: forget messages a promoter delivered, but only those whose lease it still holds.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   INFLIGHT  ZSET id -> lease deadline
--   MSG       HASH id -> envelope
--   LEASED    HASH id -> due score while in flight
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
--   LATENESS  HASH lateness bucket -> messages promoted that late (now minus the due time they had)
-- ARGV[1] lease deadline the claim returned; ARGV[2..] ids
-- Returns the number of messages acknowledged. A message whose lease expired and was claimed again is left
-- to its new holder (the lease deadline is the holder's token).

local problem = denied_command()
    or wrong_type(INFLIGHT, 'zset', MSG, 'hash', LEASED, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash',
        STATS, 'hash', LATENESS, 'hash')
if problem then
    return problem
end

local deadline = tonumber(ARGV[1])
local acked, seen = {}, {}
for i = 2, #ARGV do
    local id = ARGV[i]
    local score = redis.call('ZSCORE', INFLIGHT, id)
    -- An id given twice is acknowledged (and counted) once.
    if score and tonumber(score) == deadline and not seen[id] then
        seen[id] = true
        acked[#acked + 1] = id
    end
end
if #acked > 0 then
    local now = now_ms()
    local lateness = {}
    for _, score in ipairs(redis.call('HMGET', LEASED, unpack(acked))) do
        if score then
            lateness[#lateness + 1] = math.max(0, now - due_of(score))
        end
    end
    -- Deletes first: over maxmemory Redis refuses a script's first write only if it may grow memory, and
    -- an acknowledgement frees memory.
    redis.call('ZREM', INFLIGHT, unpack(acked))
    redis.call('HDEL', MSG, unpack(acked))
    redis.call('HDEL', LEASED, unpack(acked))
    redis.call('HDEL', ATTEMPTS, unpack(acked))
    redis.call('HDEL', ERRORS, unpack(acked))
    count_lateness(LATENESS, lateness)
    redis.call('HINCRBY', STATS, 'promoted', #acked)
end
return #acked
