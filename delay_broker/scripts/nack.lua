-- nack.lua: give back claimed messages that were not delivered: retry later with exponential backoff,
-- dead-letter, or release (back to their due time, no attempt counted: the promoter is stopping or the
-- target broker is down, which is not the message's fault).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   INFLIGHT  ZSET id -> lease deadline
--   DUE       ZSET id -> score
--   LEASED    HASH id -> due score while in flight
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
--   WAKE      LIST wake marker (released messages are due at once: another promoter may take them; a retry
--             may come due before the head)
-- ARGV[1] lease deadline the claim returned  ARGV[2] max_attempts  ARGV[3] base backoff ms
-- ARGV[4] max backoff ms  ARGV[5..] groups of 3: id, reason, action ('retry', 'dead' or 'release')
-- Returns one outcome per id: 1 = retried later, 2 = dead-lettered, 3 = released, 0 = lease no longer held
-- (left alone); then 1 if WAKE was pushed, else 0. A message whose attempts count or lease record is not a
-- number is dead-lettered, saying so.

local problem = denied_command()
    or wrong_type(INFLIGHT, 'zset', DUE, 'zset', LEASED, 'hash', DEAD, 'zset', ATTEMPTS, 'hash',
        ERRORS, 'hash', STATS, 'hash', WAKE, 'list')
if problem then
    return problem
end

local deadline = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[2])
local base = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local now = now_ms()
local result = {}
local head = head_due(DUE)
local wake = false
for i = 5, #ARGV, 3 do
    local id, reason, action = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local score = redis.call('ZSCORE', INFLIGHT, id)
    if not score or tonumber(score) ~= deadline then
        result[#result + 1] = 0
    else
        local due_score, attempts, spoiled = lease_record(LEASED, ATTEMPTS, id, now)
        -- Deletes first: over maxmemory Redis refuses a script's first write only if it may grow memory, and
        -- giving messages back is what lets the store drain.
        redis.call('ZREM', INFLIGHT, id)
        redis.call('HDEL', LEASED, id)
        if spoiled then
            dead_letter(DEAD, ERRORS, STATS, id, spoiled, now)
            result[#result + 1] = 2
        elseif action == 'release' then
            redis.call('ZADD', DUE, due_score, id)
            wake = true
            result[#result + 1] = 3
        else
            attempts = attempts + 1
            redis.call('HSET', ATTEMPTS, id, attempts)
            if action == 'dead' or attempts >= max_attempts then
                dead_letter(DEAD, ERRORS, STATS, id, reason .. ' (after ' .. attempts .. ' attempts)', now)
                result[#result + 1] = 2
            else
                local due = now + math.min(cap, base * 2 ^ (attempts - 1))
                redis.call('ZADD', DUE, fifo_score(DUE, due), id)
                redis.call('HSET', ERRORS, id, reason)
                redis.call('HINCRBY', STATS, 'retried', 1)
                -- A retry sooner than every parked message is what a sleeping promoter must wake for.
                wake = wake or not head or due < head
                result[#result + 1] = 1
            end
        end
    end
end
if wake then
    wake_one(WAKE)
end
result[#result + 1] = wake and 1 or 0
return result
