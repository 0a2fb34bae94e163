-- open_pack.lua: move the records at the head of a pack into the ordinary layout (DUE + MSG), in order, once
-- its messages come near (promoters call it; see delay_broker/packing.py).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at (a record with no due time)
--   ERRORS    HASH id -> last error
--   STATS     HASH counters ('opened'; 'dead_lettered')
--   WAKE      LIST wake marker
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's: the pack; when opening, then one per record taken: the packed index partition of its
--   id (the pack again for a record with none: cleared, or too short to hold one)
-- ARGV[1] 'peek' (reads only) or 'open'
-- ARGV[2] the pack's name
-- ARGV[3] records to look at (peek) or to take (open) from the head
-- ARGV[4] (open) the pack's base as peek returned it: a call after another promoter took the same records
--         is refused, having changed nothing
-- ARGV[5] (open) the records' 16-byte ids as peek returned them
-- ARGV[6] (open) the packed index's shape the partitions were chosen by (see pack_locate)
-- Returns, for peek, {base, the 16-byte ids of the first records run together (16 zero bytes for a record
-- with none)}; for open, {moved, dead-lettered, 1 if the pack is now empty and gone, 1 if WAKE was pushed},
-- or {-1} when the head is no longer what peek saw (peek again), or the refusal 'RESHAPED level:split' when
-- the index was split since the partitions were chosen (nothing changed).
-- A record is moved only while the index says it is its id's: one taken out by id is cleared, and one whose
-- entry points elsewhere (a hand-made change) is dropped. A record with an id but no due time is
-- dead-lettered with the reason; one too short for an id is dropped and counted ('pack_unreadable').

local PACK = KEYS[FIRST_EXTRA_KEY]
local name = ARGV[2]
local count = tonumber(ARGV[3])
local NONE = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'

local problem = wrong_type(PACK, 'list', PACK_BASE, 'hash')
if problem then
    return problem
end
local base = tonumber(redis.call('HGET', PACK_BASE, name) or '0') or 0
local records = redis.call('LRANGE', PACK, 0, count - 1)

if ARGV[1] == 'peek' then
    local ids = {}
    for n, record in ipairs(records) do
        ids[n] = #record >= 16 and string.sub(record, 1, 16) or NONE
    end
    return {base, table.concat(ids)}
end

if base ~= tonumber(ARGV[4]) or #records ~= count then
    return {-1}
end
for n, record in ipairs(records) do
    local id = #record >= 16 and string.sub(record, 1, 16) or NONE
    if id ~= string.sub(ARGV[5], n * 16 - 15, n * 16) then
        return {-1}
    end
end
problem = denied_command()
    or wrong_type(DUE, 'zset', MSG, 'hash', DEAD, 'zset', ERRORS, 'hash', WAKE, 'list', PACKS, 'zset',
        PACK_LIVE, 'hash')
    or packed_keys_wrong_type(count, FIRST_EXTRA_KEY + 1, 1)
if problem then
    return problem
end
local shape, level, split = index_shape(PACKED_SHAPE)
if shape ~= ARGV[6] then
    for n, record in ipairs(records) do
        local given = string.match(KEYS[FIRST_EXTRA_KEY + n], ':packed:(%d+)$')
        if #record >= 16 and tonumber(given) ~= index_partition(string.sub(record, 1, 16), level, split) then
            return redis.error_reply('RESHAPED ' .. shape)
        end
    end
end

-- Reads first: which records are their ids' (the index entry names this very position).
local live = {}
local unreadable = 0
for n, record in ipairs(records) do
    if #record >= 16 then
        local at = redis.call('HGET', KEYS[FIRST_EXTRA_KEY + n], string.sub(record, 1, 16))
        live[n] = at == location_value(name, base + n - 1)
    elseif #record > 0 then
        unreadable = unreadable + 1
    end
end
-- The first write counts, and can be refused (over maxmemory) before anything moved.
problem = count_first(STATS, 'opened', 0)
if problem then
    return problem
end

local now = now_ms()
local head = head_due(DUE)
local earliest = false
local moved, dead = 0, 0
for n, record in ipairs(records) do
    if live[n] then
        local binary = string.sub(record, 1, 16)
        local id = uuid_text(record, 1)
        redis.call('HDEL', KEYS[FIRST_EXTRA_KEY + n], binary)
        local due = #record > PACK_HEADER and packed_due(record)
        if redis.call('HEXISTS', MSG, id) == 1 then  -- luacheck: ignore 542
            -- Parked again in the ordinary layout by a release that knew no packs: that later park wins.
        elseif not due then
            redis.call('HSET', MSG, id, string.sub(record, PACK_HEADER + 1))
            dead_letter(DEAD, ERRORS, STATS, id, 'malformed packed record: no due time', now)
            dead = dead + 1
        else
            redis.call('ZADD', DUE, fifo_score(DUE, due), id)
            redis.call('HSET', MSG, id, string.sub(record, PACK_HEADER + 1))
            moved = moved + 1
            if not earliest or due < earliest then
                earliest = due
            end
        end
    end
end
local live_taken = 0
for _, is_live in pairs(live) do
    if is_live then
        live_taken = live_taken + 1
    end
end

redis.call('LTRIM', PACK, count, -1)
local gone = 0
if redis.call('LLEN', PACK) == 0 then
    redis.call('HDEL', PACK_BASE, name)
    redis.call('HDEL', PACK_LIVE, name)
    redis.call('ZREM', PACKS, name)
    gone = 1
else
    redis.call('HINCRBY', PACK_BASE, name, count)
    redis.call('HINCRBY', PACK_LIVE, name, -live_taken)
end
if moved > 0 then
    redis.call('HINCRBY', STATS, 'opened', moved)
end
if unreadable > 0 then
    redis.call('HINCRBY', STATS, 'pack_unreadable', unreadable)
end
local woke = 0
if earliest and (not head or earliest < head) then
    wake_one(WAKE)
    woke = 1
end
return {moved, dead, gone, woke}
