-- park_one.lua: park one message whose id the store does not hold in the ordinary layout: park.lua's commonest
-- case for a message due soon (an adapter's delayed send) with only the calls it needs. Anything else -- the id
-- held in any form (parked, packed, in flight, dead), the packed index reshaped since the caller chose the
-- partition, a due time out of bounds -- and it writes nothing and returns 0; an error (a key of the wrong
-- type, a refused first write) writes nothing either. Either way the caller parks the message with park.lua,
-- which handles each of those, naming what it refuses.
-- KEYS: one shard's keys it names, in delay_broker.keys.SCRIPT_KEYS order, named by the prelude:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at (a dead letter whose envelope went missing is here alone)
--   WAKE      LIST wake marker
--   STATS     HASH counters ('parked')
--   PACKS     ZSET (only a placeholder key: see below)
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's: the id's packed index partition (PACKS for an id never packed)
-- ARGV[1] id  ARGV[2] due time ('123': ms from Redis TIME; '@123': epoch ms)  ARGV[3] envelope
-- ARGV[4] the id's 16-byte form  ARGV[5] the packed index's shape the partition was chosen by
-- ARGV[6] max_delay_ms, or -1
-- Returns {due ms, 1 if WAKE was pushed else 0}, or 0.

local id = ARGV[1]
local partition = KEYS[FIRST_EXTRA_KEY]
local max_delay = tonumber(ARGV[6])
-- An absolute due time needs the clock only to be held to max_delay.
local now = (string.byte(ARGV[2]) ~= 64 or max_delay >= 0) and now_ms() or 0
local due = due_at(ARGV[2], now)
if due_refusal(id, due, now, max_delay) or redis.call('ZSCORE', DEAD, id) then
    return 0
end
if partition ~= PACKS and ((redis.call('GET', PACKED_SHAPE) or '0:0') ~= ARGV[5]
        or redis.call('HEXISTS', partition, ARGV[4]) == 1) then
    return 0
end
local score, woke = due_slot(DUE, due)
if woke then
    local kind = redis.call('TYPE', WAKE)['ok']
    if kind ~= 'list' and kind ~= 'none' then
        return 0
    end
end

-- The first write, and the look at MSG: an id held there is left as it is. Over maxmemory it is the write Redis
-- refuses; every other key written below was read above, but STATS.
if redis.call('HSETNX', MSG, id, ARGV[3]) == 0 then
    return 0
end
redis.call('ZADD', DUE, score, id)
local counted = redis.pcall('HINCRBY', STATS, 'parked', 1)
if type(counted) == 'table' and counted.err then
    -- A counter that is not one: undone, for park.lua to refuse by name.
    redis.call('ZREM', DUE, id)
    redis.call('HDEL', MSG, id)
    return 0
end
if woke then
    wake_one(WAKE)
    return {due, 1}
end
return {due, 0}
