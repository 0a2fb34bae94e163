-- reschedule.lua: move a parked message to a new due time (a delay of 0 makes it due now), optionally
-- replacing its envelope in the same step (an adapter whose payload carries the due time rewrites it).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   WAKE      LIST wake marker
--   MSG       HASH id -> envelope
--   PACKS     ZSET pack name -> earliest due ms of its records (see park.lua)
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's: the id's packed index partition, the pack it is said to be in (see pack_locate),
--   and the pack to move it to if its new due time is far enough ahead (PACKS when none)
-- ARGV[1] id  ARGV[2] kind ('d' = delay ms from Redis TIME, 'a' = absolute due ms)  ARGV[3] value
-- ARGV[4] max_due_ms  ARGV[5] new envelope, or '' to keep the stored one
-- ARGV[6] max_delay_ms: latest due time accepted, counted from Redis TIME (the store's max_delay), or -1
-- ARGV[7] the envelope as the caller read it, or '': the message is moved only if its stored envelope is
--         still that one. A caller that rewrites what it read (a Celery eta) must not write it back over a
--         message parked again under the same id meanwhile.
-- ARGV[8] pack_after: ms; a message due at least half this from now goes to the pack given, -1 never
-- ARGV[9] .. ARGV[11]: the packed index's shape, the id's 16-byte form and its packed location (see pack_locate)
-- Returns {new due time in ms, or -1 when the id is not parked (unknown, in flight or dead); 1 if WAKE was
-- pushed, else 0; its index partition if now past SPLIT_AT, else -1}; or a refusal of pack_locate, having
-- written nothing.

local problem = denied_command()
    or wrong_type(DUE, 'zset', WAKE, 'list', MSG, 'hash', PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash')
    or packed_keys_wrong_type(1, FIRST_EXTRA_KEY, 3)
if problem then
    return problem
end
local places, stale
places, stale, problem = pack_locate(1, FIRST_EXTRA_KEY, 3, ARGV[9], ARGV[10], ARGV[11], PACK_BASE, PACKED_SHAPE)
if problem then
    return problem
end

local id = ARGV[1]
local packed = places[1]
local stored
if packed then
    stored = packed_due(packed[4]) and string.sub(packed[4], PACK_HEADER + 1)
elseif redis.call('ZSCORE', DUE, id) then
    stored = redis.call('HGET', MSG, id)
end
-- Compared with what the caller read before anything moves, so that a refusal changes nothing.
local expected = ARGV[7]
if not stored or expected ~= '' and stored ~= expected then
    drop_stale(stale)
    return {-1, 0, -1}
end
local now = now_ms()
local due = tonumber(ARGV[3])
if ARGV[2] == 'd' then
    due = now + due
end
if due > tonumber(ARGV[4]) then
    return redis.error_reply('ERR delay_broker: due time of ' .. id .. ' is past the latest supported')
end
local max_delay = tonumber(ARGV[6])
if max_delay >= 0 and due - now > max_delay then
    return too_far(id, due - now, max_delay)
end
local envelope = ARGV[5] ~= '' and ARGV[5] or stored
local target = KEYS[FIRST_EXTRA_KEY + 2]
local pack_after = tonumber(ARGV[8])
local name = target ~= PACKS and pack_after >= 0 and due - now >= pack_after / 2
    and string.match(target, ':pack:(%d+:%d+)$')

local head = head_due(DUE)
drop_stale(stale)
if packed then
    pack_take(packed, PACKS, PACK_BASE, PACK_LIVE)
end
if name then
    if not packed then
        redis.call('ZREM', DUE, id)
        redis.call('HDEL', MSG, id)
    end
    local over, earlier = pack_append(KEYS[FIRST_EXTRA_KEY], target, name, ARGV[10], due, envelope, PACKS,
        PACK_BASE, PACK_LIVE)
    return {due, (earlier and wake_for_pack(PACKS, {[name] = true}, WAKE)) and 1 or 0,
        over and tonumber(string.match(KEYS[FIRST_EXTRA_KEY], ':packed:(%d+)$')) or -1}
end
if packed or ARGV[5] ~= '' then
    redis.call('HSET', MSG, id, envelope)
end
redis.call('ZADD', DUE, fifo_score(DUE, due), id)
if not head or due < head then
    wake_one(WAKE)
    return {due, 1, -1}
end
return {due, 0, -1}
