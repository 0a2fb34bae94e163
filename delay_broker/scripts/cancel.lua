-- cancel.lua: remove parked or dead-lettered messages before they are promoted.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
-- ARGV[1..] ids
-- Returns one flag per id: 1 = removed, 0 = not parked (unknown, already promoted, or in flight).

local problem = wrong_type(DUE, 'zset', MSG, 'hash', DEAD, 'zset', ATTEMPTS, 'hash', ERRORS, 'hash',
    STATS, 'hash')
if problem then
    return problem
end

local result = {}
local removed = {}
for i = 1, #ARGV do
    local id = ARGV[i]
    if redis.call('ZREM', DUE, id) == 1 or redis.call('ZREM', DEAD, id) == 1 then
        removed[#removed + 1] = id
        result[i] = 1
    else
        result[i] = 0
    end
end
if #removed > 0 then
    redis.call('HDEL', MSG, unpack(removed))
    redis.call('HDEL', ATTEMPTS, unpack(removed))
    redis.call('HDEL', ERRORS, unpack(removed))
    redis.call('HINCRBY', STATS, 'cancelled', #removed)
end
return result
