-- park.lua: park one or more messages (ZADD due + HSET msg), all or nothing.
-- KEYS[1] due       ZSET id -> score
-- KEYS[2] msg       HASH id -> envelope
-- KEYS[3] inflight  ZSET id -> lease deadline
-- KEYS[4] leased    HASH id -> due score while in flight
-- KEYS[5] dead      ZSET id -> dead-lettered at
-- KEYS[6] attempts  HASH id -> failed attempts
-- KEYS[7] errors    HASH id -> last error
-- KEYS[8] seq       STRING FIFO sequence
-- KEYS[9] wake      LIST wake marker
-- KEYS[10] stats    HASH counters
-- KEYS[11] cron     HASH schedule name -> due ms of the latest occurrence parked for it
-- ARGV[1] on_conflict: 'replace' (reschedule and replace the payload) or 'keep' (leave an existing id alone)
-- ARGV[2] max_due_ms: latest due time accepted
-- ARGV[3] schedule: '' or the name of a recurring schedule. With a name the call parks one occurrence, and
--         only when it is due later than the latest one parked for that schedule, ever: any number of
--         schedulers may offer the same occurrence, before or after it was promoted, and it runs once.
-- ARGV[4..] groups of 4: id, kind ('d' = delay in ms from Redis TIME, 'a' = absolute due ms), value, envelope
-- Returns a flat list, two entries per message: due_ms, outcome (1 = new, 2 = replaced, 0 = kept existing;
-- for a kept message due_ms is its current due time, or -1 when it is in flight or dead; for a refused
-- occurrence, the due time of the latest occurrence parked for its schedule).

local replace = ARGV[1] == 'replace'
local max_due = tonumber(ARGV[2])
local schedule = ARGV[3]
local now = now_ms()

-- Validate everything before writing anything: a script error does not roll back earlier writes.
local dues = {}
local count = 0
for i = 4, #ARGV, 4 do
    local value = tonumber(ARGV[i + 2])
    local due = value
    if ARGV[i + 1] == 'd' then
        due = now + value
    end
    if due > max_due then
        return redis.error_reply('ERR delay_broker: due time of ' .. ARGV[i] .. ' is past the latest supported')
    end
    count = count + 1
    dues[count] = due
end

local problem = wrong_type(KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset',
    KEYS[6], 'hash', KEYS[7], 'hash', KEYS[8], 'string', KEYS[9], 'list', KEYS[10], 'hash')
if problem then
    return problem
end

local seq = next_seq(KEYS[8], count)

-- Only scheduled parks read the cron record: a stray key there must not stop ordinary sends.
if schedule ~= '' then
    problem = wrong_type(KEYS[11], 'hash')
    if problem then
        return problem
    end
    if count ~= 1 then
        return redis.error_reply('ERR a scheduled occurrence is parked on its own')
    end
    local latest = redis.call('HGET', KEYS[11], schedule)
    if latest then
        local latest_due = tonumber(latest)
        if not latest_due then
            return redis.error_reply('ERR malformed record of schedule ' .. schedule .. ' in '
                .. KEYS[11] .. ': ' .. string.sub(latest, 1, 40) .. ' (delete the field to start it afresh)')
        end
        if dues[1] <= latest_due then
            return {latest_due, 0}
        end
    end
    redis.call('HSET', KEYS[11], schedule, dues[1])
end

local head = head_due(KEYS[1])
local earliest = false
local result = {}
local parked = 0
for n = 1, count do
    local i = 4 + (n - 1) * 4
    local id = ARGV[i]
    local outcome = 1
    local existing = redis.call('ZSCORE', KEYS[1], id)
    local held = existing or redis.call('ZSCORE', KEYS[3], id) or redis.call('ZSCORE', KEYS[5], id)
    if held and not replace then
        result[#result + 1] = existing and due_of(existing) or -1
        result[#result + 1] = 0
    else
        if held then
            outcome = 2
            redis.call('ZREM', KEYS[3], id)
            redis.call('HDEL', KEYS[4], id)
            redis.call('ZREM', KEYS[5], id)
            redis.call('HDEL', KEYS[6], id)
            redis.call('HDEL', KEYS[7], id)
        end
        redis.call('ZADD', KEYS[1], score_for(dues[n], seq + n - 1), id)
        redis.call('HSET', KEYS[2], id, ARGV[i + 3])
        if not earliest or dues[n] < earliest then
            earliest = dues[n]
        end
        parked = parked + 1
        result[#result + 1] = dues[n]
        result[#result + 1] = outcome
    end
end

if parked > 0 then
    redis.call('HINCRBY', KEYS[10], 'parked', parked)
end
if earliest and (not head or earliest < head) then
    wake_one(KEYS[9])
end
return result
