-- dramatiq_move.lua: the reference for drain_ratio into Dramatiq's RedisBroker: the least work that moves due
-- members of a ZSET into a RedisBroker queue (payload into <ns>:<queue>.msgs under the member, member RPUSHed
-- to <ns>:<queue>), exactly what Dramatiq's own "enqueue" does per message, but for a whole batch at once.
-- No envelope, no routing check, no dead letters, no heartbeat, no stats. Members are the redis_message_ids.
-- KEYS[1] due ZSET (member -> due_ms * 1024 + seq)   KEYS[2] payload HASH (member -> Dramatiq message)
-- KEYS[3] queue LIST <ns>:<queue>                    KEYS[4] queue HASH <ns>:<queue>.msgs
-- ARGV[1] batch
-- Returns the number of messages moved.

local t = redis.call('TIME')
local now = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) * 1024 + 1023
local ready = math.min(tonumber(ARGV[1]), redis.call('ZCOUNT', KEYS[1], '-inf', now))
if ready == 0 then
    return 0
end
local popped = redis.call('ZPOPMIN', KEYS[1], ready)
local ids = {}
for i = 1, #popped, 2 do
    ids[#ids + 1] = popped[i]
end
local payloads = redis.call('HMGET', KEYS[2], unpack(ids))
redis.call('HDEL', KEYS[2], unpack(ids))
local pairs = {}
for n, id in ipairs(ids) do
    pairs[#pairs + 1] = id
    pairs[#pairs + 1] = payloads[n]
end
redis.call('HSET', KEYS[4], unpack(pairs))
redis.call('RPUSH', KEYS[3], unpack(ids))
return #ids
