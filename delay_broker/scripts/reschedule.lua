-- reschedule.lua: move a parked message to a new due time (a delay of 0 makes it due now), optionally
-- replacing its envelope in the same step (an adapter whose payload carries the due time rewrites it).
-- KEYS[1] due   ZSET id -> score
-- KEYS[2] seq   STRING FIFO sequence
-- KEYS[3] wake  LIST wake marker
-- KEYS[4] msg   HASH id -> envelope
-- ARGV[1] id  ARGV[2] kind ('d' = delay ms from Redis TIME, 'a' = absolute due ms)  ARGV[3] value
-- ARGV[4] max_due_ms  ARGV[5] new envelope, or '' to keep the stored one
-- Returns the new due time in ms, or -1 when the id is not parked (unknown, in flight or dead).

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'string', KEYS[3], 'list', KEYS[4], 'hash')
if problem then
    return problem
end

local id = ARGV[1]
if not redis.call('ZSCORE', KEYS[1], id) then
    return -1
end
local due = tonumber(ARGV[3])
if ARGV[2] == 'd' then
    due = now_ms() + due
end
if due > tonumber(ARGV[4]) then
    return redis.error_reply('ERR delay_broker: due time of ' .. id .. ' is past the latest supported')
end
local head = head_due(KEYS[1])
redis.call('ZADD', KEYS[1], 'XX', score_for(due, next_seq(KEYS[2], 1)), id)
if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[4], id, ARGV[5])
end
if not head or due < head then
    wake_one(KEYS[3])
end
return due
