-- time.lua: due times and the scores that keep them (see delay_broker/clock.py).
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none.

-- Scores are due_ms * FIFO_SLOTS + slot: messages due in the same millisecond keep the order they were parked
-- in (see fifo_score). Must equal delay_broker.clock.FIFO_SLOTS.
local FIFO_SLOTS = 1024

-- The latest due time a score keeps exactly (2^53 / FIFO_SLOTS - 1). Must equal delay_broker.clock.MAX_DUE_MS.
local MAX_DUE_MS = 8796093022207

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

-- A due time as every park script takes it (delay_broker.store.encoding.Due.wire): '123' is 123 ms after
-- `now`, '@123' the epoch ms 123.
local function due_at(wire, now)
    if string.byte(wire) == 64 then
        return tonumber(string.sub(wire, 2))
    end
    return now + tonumber(wire)
end

-- The refusal of a due time past the latest supported, or further from now than `max_delay` (ms; -1: no limit),
-- or nil. The text after 'delay_broker: ' becomes the InvalidDelay users see, so it names the limit.
local function due_refusal(id, due, now, max_delay)
    if due > MAX_DUE_MS then
        return redis.error_reply('ERR delay_broker: due time of ' .. id .. ' is past the latest supported')
    end
    if max_delay >= 0 and due - now > max_delay then
        -- Seconds, whole without a fraction, else to the millisecond (as delay_broker.store.replies.seconds_text).
        local function seconds(ms)
            return ms % 1000 == 0 and string.format('%d s', ms / 1000) or string.format('%.3f s', ms / 1000)
        end
        return redis.error_reply('ERR delay_broker: due time of ' .. id .. ' is ' .. seconds(due - now)
            .. ' from now, beyond max_delay (' .. seconds(max_delay) .. ')')
    end
    return nil
end

-- The last score a call gave out per due millisecond (scripts run afresh at every call, so it starts empty at
-- every call): the next message of the same millisecond takes the next slot without asking DUE again. A park of
-- 1,000 messages due at one time made 1,000 ZRANGEs, a third of its server time.
local FIFO_TAKEN = {}

-- The score of a message due at `due_ms` that goes after every message already due in that millisecond: the
-- slot after the last one taken. Per millisecond, not from a store-wide counter, whose wrap-around would put a
-- later park first. Past the last slot, messages share it and Redis orders them by id.
local function fifo_score(due_key, due_ms)
    local first = due_ms * FIFO_SLOTS
    local last = first + FIFO_SLOTS - 1
    local taken = FIFO_TAKEN[due_ms]
    if not taken then
        local head = redis.call('ZRANGE', due_key, last, first, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
        taken = head[2] and tonumber(head[2]) or first - 1
    end
    local score = math.min(taken + 1, last)
    FIFO_TAKEN[due_ms] = score
    return score
end

-- For one message due at `due_ms`: its fifo_score and whether it is the earliest of the due ZSET (nothing due
-- at or before `due_ms`), from one look at the last score at or before that millisecond's last slot (what
-- fifo_score and head_due would find in two).
local function due_slot(due_key, due_ms)
    local first = due_ms * FIFO_SLOTS
    local last = first + FIFO_SLOTS - 1
    local before = redis.call('ZRANGE', due_key, last, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
    if not before[2] then
        return first, true
    end
    return math.min(math.max(tonumber(before[2]) + 1, first), last), false
end

-- Earliest due time (ms) in a due ZSET, or false.
local function head_due(due_key)
    local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
    if head[2] then
        return due_of(head[2])
    end
    return false
end

-- How many messages are due at `now`, at most `batch` (counted first so the head is taken with ZPOPMIN,
-- without passing every id back to ZREM).
local function count_due(due_key, now, batch)
    return math.min(batch, redis.call('ZCOUNT', due_key, '-inf', due_limit(now)))
end
