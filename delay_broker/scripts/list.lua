-- list.lua: a page of messages of one state, ordered by their score.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score (listed when ARGV[5] is 'due')
--   INFLIGHT  ZSET id -> lease deadline (listed when ARGV[5] is 'inflight')
--   DEAD      ZSET id -> dead-lettered at (listed when ARGV[5] is 'dead')
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
-- ARGV[1] min score  ARGV[2] max score  ARGV[3] offset  ARGV[4] count (<= 1000)  ARGV[5] 'due', 'inflight' or 'dead'
-- ARGV[6] '1': envelopes without their payload (see without_payload), else whole
-- Returns a flat list, five entries per message: id, score, envelope or false, attempts, last error or false.

local INDEX = ({due = DUE, inflight = INFLIGHT, dead = DEAD})[ARGV[5]]
if not INDEX then
    return redis.error_reply('ERR unknown state ' .. tostring(ARGV[5]))
end
local problem = wrong_type(INDEX, 'zset', MSG, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash')
if problem then
    return problem
end

local page = redis.call('ZRANGEBYSCORE', INDEX, ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', ARGV[3], ARGV[4])
local result = {}
if #page == 0 then
    return result
end
local ids = {}
for i = 1, #page, 2 do
    ids[#ids + 1] = page[i]
end
local envelopes = redis.call('HMGET', MSG, unpack(ids))
local attempts = redis.call('HMGET', ATTEMPTS, unpack(ids))
local errors = redis.call('HMGET', ERRORS, unpack(ids))
for n, id in ipairs(ids) do
    result[#result + 1] = id
    result[#result + 1] = page[n * 2]
    result[#result + 1] = ARGV[6] == '1' and without_payload(envelopes[n]) or envelopes[n]
    result[#result + 1] = tonumber(attempts[n] or 0) or 0
    result[#result + 1] = errors[n]
end
return result
