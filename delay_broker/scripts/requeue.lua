-- requeue.lua: move dead-lettered messages back to the parked set, due now, with their attempts reset.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DEAD      ZSET id -> dead-lettered at
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   WAKE      LIST wake marker
--   STATS     HASH counters
-- ARGV[1] limit (<= 1000), ARGV[2] offset and ARGV[3] until when no ids follow: requeue dead letters
-- dead-lettered at or before `until` (ms), from that rank among them on (the caller skips those it could not
-- requeue before). The bound keeps a requeue of all from requeuing letters that die again meanwhile, for ever.
-- ARGV[4..] ids
-- Returns {requeued, ids not requeued: not dead-lettered, or with no payload to requeue...}.

local problem = denied_command()
    or wrong_type(DEAD, 'zset', DUE, 'zset', MSG, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash',
        WAKE, 'list', STATS, 'hash')
if problem then
    return problem
end

local ids = {}
for i = 4, #ARGV do
    ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
    ids = redis.call('ZRANGE', DEAD, '-inf', ARGV[3], 'BYSCORE', 'LIMIT', ARGV[2], ARGV[1])
end
local now = now_ms()
local result = {0}
for n, id in ipairs(ids) do
    if redis.call('ZSCORE', DEAD, id) and redis.call('HEXISTS', MSG, id) == 1 then
        redis.call('ZREM', DEAD, id)
        redis.call('ZADD', DUE, fifo_score(DUE, now), id)
        redis.call('HDEL', ATTEMPTS, id)
        redis.call('HDEL', ERRORS, id)
        result[1] = result[1] + 1
    else
        result[#result + 1] = id
    end
end
if result[1] > 0 then
    redis.call('HINCRBY', STATS, 'requeued', result[1])
    wake_one(WAKE)
end
return result
