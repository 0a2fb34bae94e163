-- claim.lua: lease due messages to an at-least-once promoter, after giving expired leases back.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline (ms)
--   LEASED    HASH id -> due score while in flight
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
--   PROMOTERS ZSET promoter id -> last heartbeat
-- ARGV[1] batch (<= 1000)   ARGV[2] lease_ms   ARGV[3] max_attempts   ARGV[4] promoter id
-- Returns {now_ms, lease_deadline_ms, next_wake_ms (-1: nothing parked), id1, score1, envelope1, ...}.
-- Messages whose envelope is missing are dead-lettered here and not returned.

local batch = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local max_attempts = tonumber(ARGV[3])
local problem = wrong_type(DUE, 'zset', MSG, 'hash', INFLIGHT, 'zset', LEASED, 'hash', DEAD, 'zset',
    ATTEMPTS, 'hash', ERRORS, 'hash', STATS, 'hash', PROMOTERS, 'zset')
if problem then
    return problem
end
local now = now_ms()
redis.call('ZADD', PROMOTERS, now, ARGV[4])

-- A lease that ran out means its promoter died or stalled: the message goes back, counted as an attempt so
-- a message that kills every promoter ends up dead instead of looping forever.
local expired = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(expired) do
    local attempts = redis.call('HINCRBY', ATTEMPTS, id, 1)
    local score = redis.call('HGET', LEASED, id) or (now * FIFO_SLOTS)
    redis.call('ZREM', INFLIGHT, id)
    redis.call('HDEL', LEASED, id)
    if attempts >= max_attempts then
        dead_letter(DEAD, ERRORS, STATS, id,
            'lease expired ' .. attempts .. ' times: the promoter holding it died or stalled', now)
    else
        redis.call('ZADD', DUE, score, id)
        redis.call('HSET', ERRORS, id, 'lease expired: promoter died or stalled')
    end
end

local deadline = now + lease
local result = {now, deadline, -1}
local ready = count_due(DUE, now, batch)
if ready > 0 then
    local ids, due = pop_due(DUE, ready)
    local envelopes = redis.call('HMGET', MSG, unpack(ids))
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
            dead_letter(DEAD, ERRORS, STATS, id, 'missing payload: no envelope stored for this id', now)
        end
    end
    if #leases > 0 then
        redis.call('ZADD', INFLIGHT, unpack(leases))
        redis.call('HSET', LEASED, unpack(scores))
    end
end

local next_wake = head_due(DUE)
local lease_head = redis.call('ZRANGE', INFLIGHT, 0, 0, 'WITHSCORES')
if lease_head[2] and (not next_wake or tonumber(lease_head[2]) < next_wake) then
    next_wake = tonumber(lease_head[2])
end
if next_wake then
    result[3] = next_wake
end
return result
