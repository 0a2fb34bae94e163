-- bare_move.lua: the reference for drain_ratio: the least work that moves due members of a ZSET into a
-- list, with their payloads from a hash. No envelope, no routing, no dead letters, no heartbeat.
-- KEYS[1] due ZSET   KEYS[2] payload HASH   KEYS[3] target LIST
-- ARGV[1] batch
-- Returns the number of messages moved.

local t = redis.call('TIME')
local now = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) * 1024 + 1023
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #ids == 0 then
    return 0
end
redis.call('ZREM', KEYS[1], unpack(ids))
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
redis.call('LPUSH', KEYS[3], unpack(payloads))
return #ids
