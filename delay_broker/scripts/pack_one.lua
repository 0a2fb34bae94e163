-- pack_one.lua: append one message whose id the store does not hold to a pack, a delay from now: park.lua's
-- commonest case for a message due far ahead (an adapter's delayed send) with only the calls it needs.
-- Anything else -- the id held in any form (parked, packed, in flight, dead), the packed index reshaped since
-- the caller chose the partition, a due time out of bounds or not far enough ahead -- and it writes nothing
-- and returns 0; an error (a key of the wrong type, a refused first write) writes no message either. Either
-- way the caller parks the message with park.lua, which handles each of those, naming what it refuses.
-- KEYS: one shard's keys it names, in delay_broker.keys.SCRIPT_KEYS order, named by the prelude:
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at (a dead letter whose envelope went missing is here alone)
--   STATS     HASH counters ('parked')
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
--   WAKE      LIST wake marker (pushed when the pack becomes the earliest: see pack_append in _lib.lua)
-- KEYS after the shard's: the id's packed index partition, the pack
-- ARGV[1] id  ARGV[2] delay, ms from Redis TIME, or '@' and the due time in epoch ms  ARGV[3] envelope  ARGV[4] the id's 16-byte form
-- ARGV[5] the packed index's shape the partition was chosen by
-- ARGV[6] the pack's name  ARGV[7] pack_after ms: the message is packed only when due at least half this ahead
-- ARGV[8] max_due_ms  ARGV[9] max_delay_ms, or -1
-- Returns {due ms, 1 if the partition is past SPLIT_AT else 0, 1 if WAKE was pushed else 0}, or 0.
-- The reads come first and see the types of the keys they read. The record is the first write (over
-- maxmemory, the one Redis refuses); PACKS and STATS, not read before, come next: one of the wrong type stops
-- the script with a record that has no index entry, which is no message (opening a pack drops it).

local id, binary, name = ARGV[1], ARGV[4], ARGV[6]
local partition, pack = KEYS[FIRST_EXTRA_KEY], KEYS[FIRST_EXTRA_KEY + 1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = string.byte(ARGV[2]) == 64 and tonumber(string.sub(ARGV[2], 2)) or now + tonumber(ARGV[2])
local max_delay = tonumber(ARGV[9])
if due > tonumber(ARGV[8]) or (max_delay >= 0 and due - now > max_delay) or due - now < tonumber(ARGV[7]) / 2 then
    return 0
end
if redis.call('HEXISTS', MSG, id) == 1 or redis.call('ZSCORE', DEAD, id)
        or (redis.call('GET', PACKED_SHAPE) or '0:0') ~= ARGV[5] or redis.call('HEXISTS', partition, binary) == 1 then
    return 0
end
local base = tonumber(redis.call('HGET', PACK_BASE, name) or 0)
local live = tonumber(redis.call('HGET', PACK_LIVE, name) or 0)
if not base or not live then
    return 0
end

local position = base + redis.call('RPUSH', pack, binary .. u48_text(due) .. ARGV[3]) - 1
local earlier = redis.call('ZADD', PACKS, 'LT', 'CH', due, name) == 1
redis.call('HINCRBY', STATS, 'parked', 1)
redis.call('HSET', partition, binary, location_value(name, position))
redis.call('HSET', PACK_LIVE, name, live + 1)
local woke = earlier and wake_for_pack(PACKS, {[name] = true}, WAKE) and 1 or 0
-- Every eighth record of a pack looks at its partition's size: enough to split in time, at an eighth of the cost.
return {due, (position % 8 == 0 and redis.call('HLEN', partition) > SPLIT_AT) and 1 or 0, woke}
