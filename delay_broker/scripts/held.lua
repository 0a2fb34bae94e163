-- held.lua: what the store holds of each of some ids, as park.lua tells held ids apart (a far-tier park asks
-- before it writes its rows).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   PACK_BASE HASH pack name -> records taken from its head
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's, two per id: its packed index partition and the pack it is said to be in (pack_locate)
-- ARGV[1..#ARGV - 3] ids
-- ARGV[#ARGV - 2] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms and their packed locations
--         (see pack_locate)
-- Returns per id its due time (ms) when parked (packed or not), -1 when in flight or dead, -2 when not held;
-- or a refusal of pack_locate.

local count = #ARGV - 3
local places, stale, problem = pack_locate(count, FIRST_EXTRA_KEY, 2, ARGV[#ARGV - 2], ARGV[#ARGV - 1],
    ARGV[#ARGV], PACK_BASE, PACKED_SHAPE)
if problem then
    return problem
end
local held = {}
for n = 1, count do
    local id = ARGV[n]
    local score = redis.call('ZSCORE', DUE, id)
    if places[n] then
        held[n] = packed_due(places[n][4]) or -1
    elseif score then
        held[n] = due_of(score)
    elseif redis.call('ZSCORE', INFLIGHT, id) or redis.call('ZSCORE', DEAD, id) then
        held[n] = -1
    else
        held[n] = -2
    end
end
return held
