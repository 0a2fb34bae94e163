-- _lib.lua: helpers shared by every script. delay_broker.scripts prepends this file to each script before
-- loading it, because Redis scripts cannot import one another.
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none.

-- Scores are due_ms * FIFO_SLOTS + (sequence mod FIFO_SLOTS): messages due in the same millisecond keep the
-- order they were parked in. Must equal delay_broker.clock.FIFO_SLOTS.
local FIFO_SLOTS = 1024

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function due_of(score)
    return math.floor(tonumber(score) / FIFO_SLOTS)
end

-- Highest score that is due at `ms` (every slot of that millisecond).
local function due_limit(ms)
    return ms * FIFO_SLOTS + FIFO_SLOTS - 1
end

-- `count` consecutive scores for messages due at the given times, in park order.
local function next_seq(seq_key, count)
    return redis.call('INCRBY', seq_key, count) - count
end

local function score_for(due_ms, seq)
    return due_ms * FIFO_SLOTS + (seq % FIFO_SLOTS)
end

local function dead_letter(dead_key, errors_key, stats_key, id, reason, now)
    redis.call('ZADD', dead_key, now, id)
    redis.call('HSET', errors_key, id, reason)
    redis.call('HINCRBY', stats_key, 'dead_lettered', 1)
end

-- Earliest due time (ms) in a due ZSET, or false.
local function head_due(due_key)
    local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
    if head[2] then
        return due_of(head[2])
    end
    return false
end

-- Wake one sleeping promoter. One token is enough: whoever takes it re-reads the head for everyone.
local function wake_one(wake_key)
    redis.call('LPUSH', wake_key, '1')
    redis.call('LTRIM', wake_key, 0, 0)
end

local find, sub, decode = string.find, string.sub, cjson.decode

-- Splits an envelope into its decoded header table and payload; returns nil and a reason when malformed.
local function open_envelope(envelope)
    local newline = find(envelope, '\n', 1, true)
    if not newline then
        return nil, nil, 'malformed envelope: no header line'
    end
    local ok, header = pcall(decode, sub(envelope, 1, newline - 1))
    if not ok or type(header) ~= 'table' then
        return nil, nil, 'malformed envelope: header is not a JSON object'
    end
    return header, sub(envelope, newline + 1), nil
end
