-- held.lua: what the store holds of each of some ids, as park.lua tells held ids apart (a far-tier park asks
-- before it writes its rows).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's, two per id (id_keys): its packed index partition and the pack it is said to be in
-- ARGV[1..#ARGV - 4] ids
-- ARGV[#ARGV - 3] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms, their packed locations
--         and the key map (see by_id_trailer and id_keys)
-- Returns per id its due time (ms) when parked (packed or not), -1 when in flight or dead, -2 when not held
-- (held_due); or a refusal of pack_locate.

local count = #ARGV - 4
local keys = id_keys(count, 2)
local shape, binaries, locations = by_id_trailer()
local places, _, refusal = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if refusal then
    return refusal
end
local held = {}
for n = 1, count do
    held[n] = held_due(ARGV[n], places[n], MSG, DUE, INFLIGHT, DEAD) or -2
end
return held
