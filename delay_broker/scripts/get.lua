-- get.lua: everything known about one id.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   LEASED    HASH id -> due score while in flight
-- ARGV[1] id
-- Returns {state ('due' | 'inflight' | 'dead' | 'gone'), due_ms or -1, state time ms (lease deadline or
-- dead-lettered at) or -1, envelope or false, attempts, last error or false}.

local problem = wrong_type(DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', MSG, 'hash', ATTEMPTS, 'hash',
    ERRORS, 'hash', LEASED, 'hash')
if problem then
    return problem
end

local id = ARGV[1]
local state, due, at = 'gone', -1, -1
local score = redis.call('ZSCORE', DUE, id)
if score then
    state, due = 'due', due_of(score)
else
    score = redis.call('ZSCORE', INFLIGHT, id)
    if score then
        state, at = 'inflight', tonumber(score)
        local leased = tonumber(redis.call('HGET', LEASED, id))
        if leased then
            due = due_of(leased)
        end
    else
        score = redis.call('ZSCORE', DEAD, id)
        if score then
            state, at = 'dead', tonumber(score)
        end
    end
end
local envelope = redis.call('HGET', MSG, id)
if state == 'gone' and not envelope then
    return {state, -1, -1, false, 0, false}
end
-- A spoiled count reads as 0 (such a message is dead-lettered, saying so) rather than cutting the reply short.
local attempts = tonumber(redis.call('HGET', ATTEMPTS, id) or 0) or 0
return {state, due, at, envelope, attempts, redis.call('HGET', ERRORS, id)}
