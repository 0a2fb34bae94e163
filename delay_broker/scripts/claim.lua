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
-- ARGV[5] ahead: ms before its due time a message is claimed ('0': when due), for consumers that hold a message
--         until its own due time (Celery's eta)
-- Returns {now_ms, lease_deadline_ms, next_wake_ms (the next message's due time less ahead, or the first lease to
-- expire; -1: nothing parked or leased), dead_count, id1, score1, envelope1,
-- ..., then dead_count pairs: id, reason} (the messages this call dead-lettered).
-- Messages whose envelope is missing, or whose id is not UTF-8, are dead-lettered here and not returned; so is
-- a message whose lease record is spoiled (see lease_record).

local batch = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local max_attempts = tonumber(ARGV[3])
local problem = denied_command()
    or wrong_type(DUE, 'zset', MSG, 'hash', INFLIGHT, 'zset', LEASED, 'hash', DEAD, 'zset',
        ATTEMPTS, 'hash', ERRORS, 'hash', STATS, 'hash', PROMOTERS, 'zset')
if problem then
    return problem
end
local now = now_ms()
local dead = {}  -- id, reason, ...: told to the promoter, which counts and logs dead letters
local function bury(id, reason)
    dead_letter(DEAD, ERRORS, STATS, id, reason, now)
    dead[#dead + 1] = id
    dead[#dead + 1] = reason
end

-- A lease that ran out means its promoter died or stalled: the message goes back, counted as an attempt so
-- a message that kills every promoter ends up dead instead of looping forever.
local expired = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, batch)
for _, id in ipairs(expired) do
    local score, attempts, spoiled = lease_record(LEASED, ATTEMPTS, id, now)
    -- Deletes first: over maxmemory Redis refuses a script's first write only if it may grow memory.
    redis.call('ZREM', INFLIGHT, id)
    redis.call('HDEL', LEASED, id)
    if spoiled then
        bury(id, spoiled)
    else
        attempts = attempts + 1
        redis.call('HSET', ATTEMPTS, id, attempts)
        if attempts >= max_attempts then
            bury(id, 'lease expired ' .. attempts .. ' times: the promoter holding it died or stalled')
        else
            redis.call('ZADD', DUE, score, id)
            redis.call('HSET', ERRORS, id, 'lease expired: promoter died or stalled')
        end
    end
end

local deadline = now + lease
local result = {now, deadline, -1, 0}
local ahead = tonumber(ARGV[5])
local ready = count_due(DUE, now + ahead, batch)
if ready > 0 then
    local ids, due = pop_due(DUE, ready)
    local envelopes = redis.call('HMGET', MSG, unpack(ids))
    -- One ZADD and one HSET for the whole batch: {deadline, id, deadline, id, ...} and {id, score, ...}.
    local leases, scores = {}, {}
    for n, id in ipairs(ids) do
        local score = due[n * 2]
        if not is_utf8(id) then
            -- Promoters are handed ids as text: one they cannot read would stall its whole batch.
            bury(id, 'malformed id: not UTF-8')
        elseif envelopes[n] then
            leases[#leases + 1] = deadline
            leases[#leases + 1] = id
            scores[#scores + 1] = id
            scores[#scores + 1] = score
            result[#result + 1] = id
            result[#result + 1] = score
            result[#result + 1] = envelopes[n]
        else
            bury(id, 'missing payload: no envelope stored for this id')
        end
    end
    if #leases > 0 then
        redis.call('ZADD', INFLIGHT, unpack(leases))
        redis.call('HSET', LEASED, unpack(scores))
    end
end

local next_wake = head_due(DUE)
if next_wake then
    next_wake = next_wake - ahead
end
local lease_head = redis.call('ZRANGE', INFLIGHT, 0, 0, 'WITHSCORES')
if lease_head[2] and (not next_wake or tonumber(lease_head[2]) < next_wake) then
    next_wake = tonumber(lease_head[2])
end
if next_wake then
    result[3] = next_wake
end
local refused = heartbeat(PROMOTERS, now, ARGV[4])
if refused then
    return refused
end
result[4] = #dead / 2
for _, value in ipairs(dead) do
    result[#result + 1] = value
end
return result
