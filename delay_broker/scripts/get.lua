-- get.lua: everything known about one id.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   LEASED    HASH id -> due score while in flight
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's (id_keys): the id's packed index partition and the pack it is said to be in
-- ARGV[1] id  ARGV[2] .. ARGV[5]: the packed index's shape, the id's 16-byte form, its packed location and
--         the key map (see by_id_trailer and id_keys)
-- Returns {state ('due' | 'inflight' | 'dead' | 'gone'), due_ms or -1, state time ms (lease deadline or
-- dead-lettered at) or -1, envelope or false, attempts, last error or false}; or a refusal of pack_locate.

local keys = id_keys(1, 2)
local problem = wrong_type(DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', MSG, 'hash', ATTEMPTS, 'hash',
    ERRORS, 'hash', LEASED, 'hash', PACK_BASE, 'hash', PACK_LIVE, 'hash') or id_keys_wrong_type(keys)
if problem then
    return problem
end
local shape, binaries, locations = by_id_trailer()
local places, _, refusal = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if refusal then
    return refusal
end
local id = ARGV[1]
if places[1] then
    -- A message packed by a reschedule keeps the attempts and error it had, as in the ordinary layout.
    local record = places[1].record
    local attempts = tonumber(redis.call('HGET', ATTEMPTS, id) or 0) or 0
    return {'due', packed_due(record) or -1, -1, string.sub(record, PACK_HEADER + 1), attempts,
        redis.call('HGET', ERRORS, id)}
end

local state, due, at = 'gone', -1, -1
local score = redis.call('ZSCORE', DUE, id)
if score then
    state, due = 'due', due_of(score)
else
    score = redis.call('ZSCORE', INFLIGHT, id)
    if score then
        state, at = 'inflight', tonumber(score)
        local leased = tonumber(redis.call('HGET', LEASED, id))
        if leased then
            due = due_of(leased)
        end
    else
        score = redis.call('ZSCORE', DEAD, id)
        if score then
            state, at = 'dead', tonumber(score)
        end
    end
end
local envelope = redis.call('HGET', MSG, id)
if state == 'gone' and not envelope then
    return {state, -1, -1, false, 0, false}
end
-- A spoiled count reads as 0 (such a message is dead-lettered, saying so) rather than cutting the reply short.
local attempts = tonumber(redis.call('HGET', ATTEMPTS, id) or 0) or 0
return {state, due, at, envelope, attempts, redis.call('HGET', ERRORS, id)}
