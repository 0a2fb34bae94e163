-- purge.lua: delete dead-lettered messages for good.
-- KEYS[1] dead      ZSET id -> dead-lettered at
-- KEYS[2] msg       HASH id -> envelope
-- KEYS[3] attempts  HASH id -> failed attempts
-- KEYS[4] errors    HASH id -> last error
-- ARGV[1] limit (<= 1000) when no ids follow: purge the oldest dead letters; ARGV[2..] ids
-- Returns the number of messages deleted.

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash')
if problem then
    return problem
end

local ids = {}
for i = 2, #ARGV do
    ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
    ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
end
local deleted = {}
for _, id in ipairs(ids) do
    if redis.call('ZREM', KEYS[1], id) == 1 then
        deleted[#deleted + 1] = id
    end
end
if #deleted > 0 then
    redis.call('HDEL', KEYS[2], unpack(deleted))
    redis.call('HDEL', KEYS[3], unpack(deleted))
    redis.call('HDEL', KEYS[4], unpack(deleted))
end
return #deleted
