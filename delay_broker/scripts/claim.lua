-- claim.lua: lease due messages to an at-least-once promoter, after giving expired leases back.
-- KEYS[1] due       ZSET id -> score
-- KEYS[2] msg       HASH id -> envelope
-- KEYS[3] inflight  ZSET id -> lease deadline (ms)
-- KEYS[4] leased    HASH id -> due score while in flight
-- KEYS[5] dead      ZSET id -> dead-lettered at
-- KEYS[6] attempts  HASH id -> failed attempts
-- KEYS[7] errors    HASH id -> last error
-- KEYS[8] stats     HASH counters
-- KEYS[9] promoters ZSET promoter id -> last heartbeat
-- ARGV[1] batch (<= 1000)   ARGV[2] lease_ms   ARGV[3] max_attempts   ARGV[4] promoter id
-- Returns {now_ms, lease_deadline_ms, next_wake_ms (-1: nothing parked), id1, score1, envelope1, ...}.
-- Messages whose envelope is missing are dead-lettered here and not returned.

local batch = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local max_attempts = tonumber(ARGV[3])
local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset',
    KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'hash', KEYS[9], 'zset')
if problem then
    return problem
end
local now = now_ms()
redis.call('ZADD', KEYS[9], now, ARGV[4])

-- A lease that ran out means its promoter died or stalled: the message goes back, counted as an attempt so
-- a message that kills every promoter ends up dead instead of looping forever.
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(expired) do
    local attempts = redis.call('HINCRBY', KEYS[6], id, 1)
    local score = redis.call('HGET', KEYS[4], id) or (now * FIFO_SLOTS)
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    if attempts >= max_attempts then
        dead_letter(KEYS[5], KEYS[7], KEYS[8], id,
            'lease expired ' .. attempts .. ' times: the promoter holding it died or stalled', now)
    else
        redis.call('ZADD', KEYS[1], score, id)
        redis.call('HSET', KEYS[7], id, 'lease expired: promoter died or stalled')
    end
end

local deadline = now + lease
local result = {now, deadline, -1}
local ready = count_due(KEYS[1], now, batch)
if ready > 0 then
    local ids, due = pop_due(KEYS[1], ready)
    local envelopes = redis.call('HMGET', KEYS[2], unpack(ids))
    -- One ZADD and one HSET for the whole batch: {deadline, id, deadline, id, ...} and {id, score, ...}.
    local leases, scores = {}, {}
    for n, id in ipairs(ids) do
        local score = due[n * 2]
        if envelopes[n] then
            leases[#leases + 1] = deadline
            leases[#leases + 1] = id
            scores[#scores + 1] = id
            scores[#scores + 1] = score
            result[#result + 1] = id
            result[#result + 1] = score
            result[#result + 1] = envelopes[n]
        else
            dead_letter(KEYS[5], KEYS[7], KEYS[8], id, 'missing payload: no envelope stored for this id', now)
        end
    end
    if #leases > 0 then
        redis.call('ZADD', KEYS[3], unpack(leases))
        redis.call('HSET', KEYS[4], unpack(scores))
    end
end

local next_wake = head_due(KEYS[1])
local lease_head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if lease_head[2] and (not next_wake or tonumber(lease_head[2]) < next_wake) then
    next_wake = tonumber(lease_head[2])
end
if next_wake then
    result[3] = next_wake
end
return result
