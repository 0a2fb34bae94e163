-- pack_one.lua: append one message whose id the store does not hold to a pack: park.lua's commonest case for a
-- message due far ahead (an adapter's delayed send) with only the calls it needs. Anything else -- the id held
-- in any form (parked, packed, in flight, dead), the packed index reshaped since the caller chose the
-- partition, a due time out of bounds or not far enough ahead, the pack's bookkeeping damaged -- and it writes
-- nothing and returns 0; an error (a key of the wrong type, a refused first write) writes nothing either.
-- Either way the caller parks the message with park.lua, which handles each of those, naming what it refuses.
-- KEYS: one shard's keys it names, in delay_broker.keys.SCRIPT_KEYS order, named by the prelude:
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at (a dead letter whose envelope went missing is here alone)
--   STATS     HASH counters ('parked')
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
--   WAKE      LIST wake marker (pushed when the pack becomes the earliest: see wake_for_pack)
--   GENERATION    STRING the shard's layout generation (see layout_refusal)
-- KEYS after the shard's: the id's packed index partition, the pack
-- ARGV[1] id  ARGV[2] due time ('123': ms from Redis TIME; '@123': epoch ms)  ARGV[3] envelope
-- ARGV[4] the id's 16-byte form  ARGV[5] the packed index's shape the partition was chosen by
-- ARGV[6] the pack's name  ARGV[7] min_ahead_ms: the message is packed only when due at least this far ahead
-- ARGV[8] max_delay_ms, or -1  ARGV[9] the layout generation the caller parks by
-- Returns {due ms, 1 if the partition is past SPLIT_AT else 0, 1 if WAKE was pushed else 0}, or 0; or the refusal
-- of layout_refusal.
-- Every key it writes is read first, which checks its type; the record is the first write (over maxmemory, the
-- one Redis refuses). The counter comes last and may fail alone: a figure, not a message.

local refusal = layout_refusal(GENERATION, ARGV[9])
if refusal then
    return refusal
end
local id, binary, name = ARGV[1], ARGV[4], ARGV[6]
local partition, pack = KEYS[FIRST_EXTRA_KEY], KEYS[FIRST_EXTRA_KEY + 1]
local now = now_ms()
local due = due_at(ARGV[2], now)
if due_refusal(id, due, now, tonumber(ARGV[8])) or due - now < tonumber(ARGV[7]) then
    return 0
end
if held_unpacked(id, MSG, DEAD) or (redis.call('GET', PACKED_SHAPE) or '0:0') ~= ARGV[5]
        or redis.call('HEXISTS', partition, binary) == 1 then
    return 0
end
local target = pack_target(PACKS, PACK_BASE, PACK_LIVE, pack, name)
if not target then
    return 0
end

local position, earlier = pack_append(target, partition, binary, due, ARGV[3], PACKS, PACK_LIVE)
redis.pcall('HINCRBY', STATS, 'parked', 1)
local woke = earlier and wake_for_pack(PACKS, {[name] = true}, WAKE) and 1 or 0
-- Every eighth record of a pack looks at its partition's size: enough to split in time, at an eighth of the cost.
return {due, (position % 8 == 0 and redis.call('HLEN', partition) > SPLIT_AT) and 1 or 0, woke}
