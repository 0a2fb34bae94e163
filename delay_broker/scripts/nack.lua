-- nack.lua: give back claimed messages that were not delivered: retry later with exponential backoff,
-- dead-letter, or release (back to their due time, no attempt counted: the promoter is stopping or the
-- target broker is down, which is not the message's fault).
-- KEYS[1] inflight  ZSET id -> lease deadline
-- KEYS[2] due       ZSET id -> score
-- KEYS[3] leased    HASH id -> due score while in flight
-- KEYS[4] dead      ZSET id -> dead-lettered at
-- KEYS[5] attempts  HASH id -> failed attempts
-- KEYS[6] errors    HASH id -> last error
-- KEYS[7] seq       STRING FIFO sequence
-- KEYS[8] stats     HASH counters
-- KEYS[9] wake      LIST wake marker (released messages are due at once: another promoter may take them)
-- ARGV[1] lease deadline the claim returned  ARGV[2] max_attempts  ARGV[3] base backoff ms
-- ARGV[4] max backoff ms  ARGV[5..] groups of 3: id, reason, action ('retry', 'dead' or 'release')
-- Returns one outcome per id: 1 = retried later, 2 = dead-lettered, 3 = released, 0 = lease no longer held
-- (left alone).

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'zset', KEYS[5], 'hash',
    KEYS[6], 'hash', KEYS[7], 'string', KEYS[8], 'hash', KEYS[9], 'list')
if problem then
    return problem
end

local deadline = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[2])
local base = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local now = now_ms()
-- Sequence numbers are taken before anything moves: a failing INCRBY (a corrupt counter) must not strike
-- after a message has left the in-flight set.
local seq = next_seq(KEYS[7], (#ARGV - 4) / 3)
local result = {}
local released = false
for i = 5, #ARGV, 3 do
    local id, reason, action = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local score = redis.call('ZSCORE', KEYS[1], id)
    if not score or tonumber(score) ~= deadline then
        result[#result + 1] = 0
    else
        local due_score = redis.call('HGET', KEYS[3], id) or (now * FIFO_SLOTS)
        local attempts = 0
        if action ~= 'release' then
            attempts = redis.call('HINCRBY', KEYS[5], id, 1)
        end
        redis.call('ZREM', KEYS[1], id)
        redis.call('HDEL', KEYS[3], id)
        if action == 'release' then
            redis.call('ZADD', KEYS[2], due_score, id)
            released = true
            result[#result + 1] = 3
        elseif action == 'dead' or attempts >= max_attempts then
            dead_letter(KEYS[4], KEYS[6], KEYS[8], id, reason .. ' (after ' .. attempts .. ' attempts)', now)
            result[#result + 1] = 2
        else
            local backoff = math.min(cap, base * 2 ^ (attempts - 1))
            redis.call('ZADD', KEYS[2], score_for(now + backoff, seq + (i - 5) / 3), id)
            redis.call('HSET', KEYS[6], id, reason)
            redis.call('HINCRBY', KEYS[8], 'retried', 1)
            result[#result + 1] = 1
        end
    end
end
if released then
    wake_one(KEYS[9])
end
return result
