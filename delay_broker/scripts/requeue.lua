-- requeue.lua: move dead-lettered messages back to the parked set, due now, with their attempts reset.
-- KEYS[1] dead      ZSET id -> dead-lettered at
-- KEYS[2] due       ZSET id -> score
-- KEYS[3] msg       HASH id -> envelope
-- KEYS[4] attempts  HASH id -> failed attempts
-- KEYS[5] errors    HASH id -> last error
-- KEYS[6] seq       STRING FIFO sequence
-- KEYS[7] wake      LIST wake marker
-- KEYS[8] stats     HASH counters
-- ARGV[1] limit (<= 1000) and ARGV[2] offset when no ids follow: requeue dead letters from that rank on (the
-- caller skips those it could not requeue before); ARGV[3..] ids
-- Returns {requeued, ids not requeued: not dead-lettered, or with no payload to requeue...}.

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash',
    KEYS[6], 'string', KEYS[7], 'list', KEYS[8], 'hash')
if problem then
    return problem
end

local ids = {}
for i = 3, #ARGV do
    ids[#ids + 1] = ARGV[i]
end
if #ids == 0 then
    local offset = tonumber(ARGV[2])
    ids = redis.call('ZRANGE', KEYS[1], offset, offset + tonumber(ARGV[1]) - 1)
end
local now = now_ms()
local seq = next_seq(KEYS[6], #ids)
local result = {0}
for n, id in ipairs(ids) do
    if redis.call('ZSCORE', KEYS[1], id) and redis.call('HEXISTS', KEYS[3], id) == 1 then
        redis.call('ZREM', KEYS[1], id)
        redis.call('ZADD', KEYS[2], score_for(now, seq + n - 1), id)
        redis.call('HDEL', KEYS[4], id)
        redis.call('HDEL', KEYS[5], id)
        result[1] = result[1] + 1
    else
        result[#result + 1] = id
    end
end
if result[1] > 0 then
    redis.call('HINCRBY', KEYS[8], 'requeued', result[1])
    wake_one(KEYS[7])
end
return result
