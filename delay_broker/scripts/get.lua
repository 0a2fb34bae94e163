-- get.lua: everything known about one id.
-- KEYS[1] due       ZSET id -> score
-- KEYS[2] inflight  ZSET id -> lease deadline
-- KEYS[3] dead      ZSET id -> dead-lettered at
-- KEYS[4] msg       HASH id -> envelope
-- KEYS[5] attempts  HASH id -> failed attempts
-- KEYS[6] errors    HASH id -> last error
-- KEYS[7] leased    HASH id -> due score while in flight
-- ARGV[1] id
-- Returns {state ('due' | 'inflight' | 'dead' | 'gone'), due_ms or -1, state time ms (lease deadline or
-- dead-lettered at) or -1, envelope or false, attempts, last error or false}.

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash',
    KEYS[6], 'hash', KEYS[7], 'hash')
if problem then
    return problem
end

local id = ARGV[1]
local state, due, at = 'gone', -1, -1
local score = redis.call('ZSCORE', KEYS[1], id)
if score then
    state, due = 'due', due_of(score)
else
    score = redis.call('ZSCORE', KEYS[2], id)
    if score then
        state, at = 'inflight', tonumber(score)
        local leased = redis.call('HGET', KEYS[7], id)
        if leased then
            due = due_of(leased)
        end
    else
        score = redis.call('ZSCORE', KEYS[3], id)
        if score then
            state, at = 'dead', tonumber(score)
        end
    end
end
local envelope = redis.call('HGET', KEYS[4], id)
if state == 'gone' and not envelope then
    return {state, -1, -1, false, 0, false}
end
return {state, due, at, envelope, tonumber(redis.call('HGET', KEYS[5], id) or 0), redis.call('HGET', KEYS[6], id)}
