-- purge.lua: delete dead-lettered messages for good.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DEAD      ZSET id -> dead-lettered at
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
-- ARGV[1] limit (<= 1000) when no ids follow: purge the oldest dead letters; ARGV[2..] ids
-- Returns the number of messages deleted.

local problem = denied_command()
    or wrong_type(DEAD, 'zset', MSG, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash')
if problem then
    return problem
end

local ids = {}
for i = 2, #ARGV do
    ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
    ids = redis.call('ZRANGE', DEAD, 0, tonumber(ARGV[1]) - 1)
end
local deleted = {}
for _, id in ipairs(ids) do
    if redis.call('ZREM', DEAD, id) == 1 then
        deleted[#deleted + 1] = id
    end
end
if #deleted > 0 then
    redis.call('HDEL', MSG, unpack(deleted))
    redis.call('HDEL', ATTEMPTS, unpack(deleted))
    redis.call('HDEL', ERRORS, unpack(deleted))
end
return #deleted
