-- reschedule.lua: move a parked message to a new due time (a delay of 0 makes it due now), optionally
-- replacing its envelope in the same step (an adapter whose payload carries the due time rewrites it).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   WAKE      LIST wake marker
--   MSG       HASH id -> envelope
--   STATS     HASH counters ('pack_damaged')
--   PACKS     ZSET pack name -> earliest due ms of its records (see park.lua)
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's (id_keys): the id's packed index partition, the pack it is said to be in (see
--   pack_locate), and the pack to move it to if its new due time is far enough ahead (PACKS when none)
-- ARGV[1] id  ARGV[2] due time ('123': ms from Redis TIME; '@123': epoch ms)  ARGV[3] new envelope, or '' to
--         keep the stored one
-- ARGV[4] max_delay_ms: latest due time accepted, counted from Redis TIME (the store's max_delay), or -1
-- ARGV[5] the envelope as the caller read it, or '': the message is moved only if its stored envelope is
--         still that one. A caller that rewrites what it read (a Celery eta) must not write it back over a
--         message parked again under the same id meanwhile.
-- ARGV[6] min_ahead_ms: a message due at least this far ahead goes to the pack given; -1 never
-- ARGV[7] .. ARGV[10]: the packed index's shape, the id's 16-byte form, its packed location and the key map
--         (see by_id_trailer and id_keys)
-- Returns {new due time in ms, or -1 when the id is not parked (unknown, in flight or dead); 1 if WAKE was
-- pushed, else 0; its index partition if now past SPLIT_AT, else -1}; or a refusal, having written nothing.

local keys = id_keys(1, 3)
local problem = denied_command()
    or wrong_type(DUE, 'zset', WAKE, 'list', MSG, 'hash', STATS, 'hash', PACKS, 'zset', PACK_BASE, 'hash',
        PACK_LIVE, 'hash')
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

local id = ARGV[1]
local place = places[1]
local stored
if place then
    stored = packed_due(place.record) and string.sub(place.record, PACK_HEADER + 1)
elseif redis.call('ZSCORE', DUE, id) then
    stored = redis.call('HGET', MSG, id)
end
-- Compared with what the caller read before anything moves, so that a refusal changes nothing.
local expected = ARGV[5]
if not stored or expected ~= '' and stored ~= expected then
    drop_stale(stale, STATS)
    return {-1, 0, -1}
end
local now = now_ms()
local due = due_at(ARGV[2], now)
local refusal = due_refusal(id, due, now, tonumber(ARGV[4]))
if refusal then
    return refusal
end
local envelope = ARGV[3] ~= '' and ARGV[3] or stored
local key = keys[1].target
local min_ahead = tonumber(ARGV[6])
local name = key ~= PACKS and min_ahead >= 0 and due - now >= min_ahead and string.match(key, ':pack:(%d+:%d+)$')
local target = name and pack_target(PACKS, PACK_BASE, PACK_LIVE, key, name)
if name and not target then
    count_damage(STATS, 1)  -- the message takes the ordinary layout
end

local head = head_due(DUE)
drop_stale(stale, STATS)
if place then
    pack_take(place, PACKS, PACK_BASE, PACK_LIVE)
end
if target then
    if not place then
        redis.call('ZREM', DUE, id)
        redis.call('HDEL', MSG, id)
    end
    local partition = keys[1].partition
    local _, earlier = pack_append(target, partition, binary_at(binaries, 1), due, envelope, PACKS, PACK_LIVE)
    local over = redis.call('HLEN', partition) > SPLIT_AT and tonumber(string.match(partition, ':packed:(%d+)$'))
    return {due, (earlier and wake_for_pack(PACKS, {[name] = true}, WAKE)) and 1 or 0, over or -1}
end
if place or ARGV[3] ~= '' then
    redis.call('HSET', MSG, id, envelope)
end
redis.call('ZADD', DUE, fifo_score(DUE, due), id)
if not head or due < head then
    wake_one(WAKE)
    return {due, 1, -1}
end
return {due, 0, -1}
