-- cancel.lua: remove parked or dead-lettered messages before they are promoted.
-- KEYS[1] due       ZSET id -> score
-- KEYS[2] msg       HASH id -> envelope
-- KEYS[3] dead      ZSET id -> dead-lettered at
-- KEYS[4] attempts  HASH id -> failed attempts
-- KEYS[5] errors    HASH id -> last error
-- KEYS[6] stats     HASH counters
-- ARGV[1..] ids
-- Returns one flag per id: 1 = removed, 0 = not parked (unknown, already promoted, or in flight).

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash',
    KEYS[6], 'hash')
if problem then
    return problem
end

local result = {}
local removed = {}
for i = 1, #ARGV do
    local id = ARGV[i]
    if redis.call('ZREM', KEYS[1], id) == 1 or redis.call('ZREM', KEYS[3], id) == 1 then
        removed[#removed + 1] = id
        result[i] = 1
    else
        result[i] = 0
    end
end
if #removed > 0 then
    redis.call('HDEL', KEYS[2], unpack(removed))
    redis.call('HDEL', KEYS[4], unpack(removed))
    redis.call('HDEL', KEYS[5], unpack(removed))
    redis.call('HINCRBY', KEYS[6], 'cancelled', #removed)
end
return result
