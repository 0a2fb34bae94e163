-- purge.lua: delete dead-lettered messages for good.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DEAD      ZSET id -> dead-lettered at
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
-- ARGV[1] limit (<= 1000) and ARGV[2] until when no ids follow: purge the oldest dead letters, among those
-- dead-lettered at or before `until` (ms): what was confirmed, not letters that died since. ARGV[3..] ids
-- Returns the number of messages deleted.

local problem = denied_command()
    or wrong_type(DEAD, 'zset', MSG, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash')
if problem then
    return problem
end

local ids = {}
for i = 3, #ARGV do
    ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
    ids = redis.call('ZRANGE', DEAD, '-inf', ARGV[2], 'BYSCORE', 'LIMIT', 0, ARGV[1])
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
