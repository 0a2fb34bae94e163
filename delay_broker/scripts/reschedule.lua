-- reschedule.lua: move a parked message to a new due time (a delay of 0 makes it due now), optionally
-- replacing its envelope in the same step (an adapter whose payload carries the due time rewrites it).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   WAKE      LIST wake marker
--   MSG       HASH id -> envelope
-- ARGV[1] id  ARGV[2] kind ('d' = delay ms from Redis TIME, 'a' = absolute due ms)  ARGV[3] value
-- ARGV[4] max_due_ms  ARGV[5] new envelope, or '' to keep the stored one
-- ARGV[6] max_delay_ms: latest due time accepted, counted from Redis TIME (the store's max_delay), or -1
-- ARGV[7] (optional) the envelope as the caller read it, or '': the message is moved only if its stored
--         envelope is still that one. A caller that rewrites what it read (a Celery eta) must not write it
--         back over a message parked again under the same id meanwhile.
-- Returns {new due time in ms, or -1 when the id is not parked (unknown, in flight or dead); 1 if WAKE was
-- pushed, else 0}.

local problem = denied_command()
    or wrong_type(DUE, 'zset', WAKE, 'list', MSG, 'hash')
if problem then
    return problem
end

local id = ARGV[1]
if not redis.call('ZSCORE', DUE, id) then
    return {-1, 0}
end
local expected = ARGV[7] or ''
if expected ~= '' and redis.call('HGET', MSG, id) ~= expected then
    return {-1, 0}
end
local now = now_ms()
local due = tonumber(ARGV[3])
if ARGV[2] == 'd' then
    due = now + due
end
if due > tonumber(ARGV[4]) then
    return redis.error_reply('ERR delay_broker: due time of ' .. id .. ' is past the latest supported')
end
local max_delay = tonumber(ARGV[6])
if max_delay >= 0 and due - now > max_delay then
    return too_far(id, due - now, max_delay)
end
local head = head_due(DUE)
redis.call('ZADD', DUE, 'XX', fifo_score(DUE, due), id)
if ARGV[5] ~= '' then
    redis.call('HSET', MSG, id, ARGV[5])
end
if not head or due < head then
    wake_one(WAKE)
    return {due, 1}
end
return {due, 0}
