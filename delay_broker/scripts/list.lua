-- list.lua: a page of messages of one state, ordered by their score.
-- KEYS[1] index     ZSET to list: due (by due time), inflight (by lease deadline) or dead (by time)
-- KEYS[2] msg       HASH id -> envelope
-- KEYS[3] attempts  HASH id -> failed attempts
-- KEYS[4] errors    HASH id -> last error
-- ARGV[1] min score  ARGV[2] max score  ARGV[3] offset  ARGV[4] count (<= 1000)
-- Returns a flat list, five entries per message: id, score, envelope or false, attempts, last error or false.

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash')
if problem then
    return problem
end

local page = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', ARGV[3], ARGV[4])
local result = {}
if #page == 0 then
    return result
end
local ids = {}
for i = 1, #page, 2 do
    ids[#ids + 1] = page[i]
end
local envelopes = redis.call('HMGET', KEYS[2], unpack(ids))
local attempts = redis.call('HMGET', KEYS[3], unpack(ids))
local errors = redis.call('HMGET', KEYS[4], unpack(ids))
for n, id in ipairs(ids) do
    result[#result + 1] = id
    result[#result + 1] = page[n * 2]
    result[#result + 1] = envelopes[n]
    result[#result + 1] = tonumber(attempts[n] or 0)
    result[#result + 1] = errors[n]
end
return result
