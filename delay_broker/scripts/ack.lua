-- ack.lua: forget messages a promoter delivered, but only those whose lease it still holds.
-- KEYS[1] inflight  ZSET id -> lease deadline
-- KEYS[2] msg       HASH id -> envelope
-- KEYS[3] leased    HASH id -> due score while in flight
-- KEYS[4] attempts  HASH id -> failed attempts
-- KEYS[5] errors    HASH id -> last error
-- KEYS[6] stats     HASH counters
-- ARGV[1] lease deadline the claim returned; ARGV[2..] ids
-- Returns the number of messages acknowledged. A message whose lease expired and was claimed again is left
-- to its new holder (the lease deadline is the holder's token).

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash',
    KEYS[6], 'hash')
if problem then
    return problem
end

local deadline = tonumber(ARGV[1])
local acked, seen = {}, {}
for i = 2, #ARGV do
    local id = ARGV[i]
    local score = redis.call('ZSCORE', KEYS[1], id)
    -- An id given twice is acknowledged (and counted) once.
    if score and tonumber(score) == deadline and not seen[id] then
        seen[id] = true
        acked[#acked + 1] = id
    end
end
if #acked > 0 then
    redis.call('ZREM', KEYS[1], unpack(acked))
    redis.call('HDEL', KEYS[2], unpack(acked))
    redis.call('HDEL', KEYS[3], unpack(acked))
    redis.call('HDEL', KEYS[4], unpack(acked))
    redis.call('HDEL', KEYS[5], unpack(acked))
    redis.call('HINCRBY', KEYS[6], 'promoted', #acked)
end
return #acked
