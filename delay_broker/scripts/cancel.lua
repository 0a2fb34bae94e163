-- cancel.lua: remove parked or dead-lettered messages before they are promoted.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline ('replace' only)
--   LEASED    HASH id -> due score while in flight ('replace' only)
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
--   PACKS     ZSET pack name -> earliest due ms of its records (see park.lua)
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's, two per id (id_keys): its packed index partition and the pack it is said to be in
-- ARGV[1] 'cancel', or 'replace': the messages are replaced by far-tier rows of the same ids, so a copy a
--         promoter holds goes too, as park.lua replaces one (its delivery is under way or done: counted as
--         promoted here, for the promoter's ack will find no lease to count)
-- ARGV[2..#ARGV - 4] ids
-- ARGV[#ARGV - 3] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms, their packed locations
--         and the key map (see by_id_trailer and id_keys)
-- Returns one flag per id: 2 = removed while parked, 1 = removed while dead (or in flight, 'replace' only),
-- 0 = not held (unknown, already promoted, or in flight, unless 'replace'); or a refusal, having written
-- nothing.

local replacing = ARGV[1] == 'replace'
local count = #ARGV - 5
local keys = id_keys(count, 2)
local problem = denied_command()
    or wrong_type(DUE, 'zset', MSG, 'hash', DEAD, 'zset', ATTEMPTS, 'hash', ERRORS, 'hash',
        STATS, 'hash', PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash')
    or (replacing and wrong_type(INFLIGHT, 'zset', LEASED, 'hash'))
    or id_keys_wrong_type(keys)
if problem then
    return problem
end
local shape, binaries, locations = by_id_trailer()
local places, stale
places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if problem then
    return problem
end
drop_stale(stale, STATS)

local result = {}
local removed = {}
local taken = {}
local cancelled, delivered = 0, 0
for i = 2, count + 1 do
    local id = ARGV[i]
    result[i - 1] = 1
    if places[i - 1] and not taken[id] then
        taken[id] = true
        pack_take(places[i - 1], PACKS, PACK_BASE, PACK_LIVE)
        cancelled = cancelled + 1
        result[i - 1] = 2
    elseif redis.call('ZREM', DUE, id) == 1 then
        cancelled = cancelled + 1
        result[i - 1] = 2
    elseif redis.call('ZREM', DEAD, id) == 1 then
        cancelled = cancelled + 1
    elseif replacing and redis.call('ZREM', INFLIGHT, id) == 1 then
        redis.call('HDEL', LEASED, id)
        delivered = delivered + 1
    else
        result[i - 1] = 0
    end
    if result[i - 1] ~= 0 then
        removed[#removed + 1] = id
    end
end
if #removed > 0 then
    redis.call('HDEL', MSG, unpack(removed))
    redis.call('HDEL', ATTEMPTS, unpack(removed))
    redis.call('HDEL', ERRORS, unpack(removed))
end
-- Not counted when replacing: the far row is the same message, parked again (and counted there).
if cancelled > 0 and not replacing then
    redis.call('HINCRBY', STATS, 'cancelled', cancelled)
end
if delivered > 0 then
    redis.call('HINCRBY', STATS, 'promoted', delivered)
end
return result
