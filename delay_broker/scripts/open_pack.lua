-- open_pack.lua: move the records at the head of a pack into the ordinary layout (DUE + MSG), in order, once
-- its messages come near (promoters call it; see delay_broker/packing.py).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at (a record with no due time, or whose index entry is gone)
--   ERRORS    HASH id -> last error
--   STATS     HASH counters ('opened'; 'dead_lettered', 'pack_unreadable', 'pack_damaged')
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
-- ARGV[4] (peek) most bytes of records to take in one call, but for the first record: a call blocks Redis for
--         as long as it copies records, and 100 records of 1 MiB held it for two seconds
--         (open) the pack's base as peek returned it: a call after another promoter took the same records is
--         refused, having changed nothing
-- ARGV[5] (open) the records' 16-byte ids as peek returned them
-- ARGV[6] (open) the packed index's shape the partitions were chosen by (see pack_locate)
-- Returns, for peek, {base, the 16-byte ids of the first records run together (16 zero bytes for a record
-- with none)}; for open, {moved, dead-lettered, 1 if the pack is now empty and gone, 1 if WAKE was pushed,
-- records found damaged, messages the bookkeeping counted that were not found}; {-1} when the head is no
-- longer what peek saw (peek again); {-2, what is wrong} when the pack's bookkeeping or the index's shape is
-- damaged (counted, nothing else changed: `delay-broker check --repair`); or the refusal 'RESHAPED level:split'
-- when the index was split since the partitions were chosen (nothing changed).
-- A record is moved while the index says it is its id's. One taken out by id is cleared, and passed over. One
-- whose id has no index entry, or an entry that points at no record of that id, is damage (only a hand-made
-- change makes one): counted, and dead-lettered with the reason unless the store holds its id elsewhere. A record with an id but no due
-- time is dead-lettered with the reason; one too short for an id is dropped and counted ('pack_unreadable').

local PACK = KEYS[FIRST_EXTRA_KEY]
local name = ARGV[2]
local count = tonumber(ARGV[3])
local NONE = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'

local problem = wrong_type(PACK, 'list', PACK_BASE, 'hash', PACK_LIVE, 'hash', STATS, 'hash')
if problem then
    return problem
end
local counts, damage = pack_counts(PACK_BASE, PACK_LIVE, name)
if not counts then
    count_damage(STATS, 1)
    return {-2, damage}
end
local base = counts.base

-- The records at the head of the pack, at most `wanted`, and no more once `budget` bytes are read: read in
-- runs that double, so that a pack of large records is not read whole to find that one is enough.
local function head_records(wanted, budget)
    local records, bytes, run = {}, 0, 1
    while #records < wanted and bytes < budget do
        local size = math.min(run, wanted - #records)
        local got = redis.call('LRANGE', PACK, #records, #records + size - 1)
        for _, record in ipairs(got) do
            records[#records + 1] = record
            bytes = bytes + #record
            if bytes >= budget then
                break
            end
        end
        if #got < size then
            break
        end
        run = run * 2
    end
    return records
end

if ARGV[1] == 'peek' then
    local ids = {}
    for n, record in ipairs(head_records(count, tonumber(ARGV[4]))) do
        ids[n] = #record >= 16 and string.sub(record, 1, 16) or NONE
    end
    return {base, table.concat(ids)}
end

local records = redis.call('LRANGE', PACK, 0, count - 1)
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
    or wrong_type(DUE, 'zset', MSG, 'hash', DEAD, 'zset', ERRORS, 'hash', WAKE, 'list', PACKS, 'zset')
if problem then
    return problem
end
local keys = {}
for n = 1, count do
    keys[n] = {partition = KEYS[FIRST_EXTRA_KEY + n], pack = PACK}
end
problem = id_keys_wrong_type(keys)
if problem then
    return problem
end
local shape, level, split = index_shape(PACKED_SHAPE)
if not shape then
    count_damage(STATS, 1)
    return {-2, level}
end
if shape ~= ARGV[6] then
    for n, record in ipairs(records) do
        local given = string.match(keys[n].partition, ':packed:(%d+)$')
        if #record >= 16 and tonumber(given) ~= index_partition(string.sub(record, 1, 16), level, split) then
            return redis.error_reply('RESHAPED ' .. shape)
        end
    end
end

-- Whether the index entry `at` of the id `binary` points at a record of that id elsewhere in this pack (a
-- stale copy is then this one); an entry into another pack is taken as true: that pack is not ours to read.
local function indexed_elsewhere(at, binary)
    local other, position = parse_location(at)
    if other ~= name then
        return other ~= nil
    end
    local record = position >= base and redis.call('LINDEX', PACK, position - base)
    return record and string.sub(record, 1, 16) == binary or false
end

-- Reads first: which records are their ids' (the index entry names this very position), which are damage.
local live, orphans = {}, {}
local unreadable, damaged, live_taken, orphaned = 0, 0, 0, 0
for n, record in ipairs(records) do
    if #record >= 16 then
        local binary = string.sub(record, 1, 16)
        local at = redis.call('HGET', keys[n].partition, binary)
        live[n] = at == location_value(name, base + n - 1)
        if live[n] then
            live_taken = live_taken + 1
        else
            damaged = damaged + 1
            orphans[n] = #record > PACK_HEADER and not (at and indexed_elsewhere(at, binary))
            orphaned = orphaned + (orphans[n] and 1 or 0)
        end
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
    local id = (live[n] or orphans[n]) and uuid_text(record, 1)
    local due = id and #record > PACK_HEADER and packed_due(record)
    if live[n] then
        redis.call('HDEL', keys[n].partition, string.sub(record, 1, 16))
    end
    if not id or redis.call('HEXISTS', MSG, id) == 1 then  -- luacheck: ignore 542
        -- Nothing to move; or the id parked again in the ordinary layout (by a release that knew no packs, or
        -- after damage): that later park wins.
    elseif orphans[n] or not due then
        redis.call('HSET', MSG, id, string.sub(record, PACK_HEADER + 1))
        dead_letter(DEAD, ERRORS, STATS, id, orphans[n]
            and 'packed record without its index entry (damage: see delay-broker check)'
            or 'malformed packed record: no due time', now)
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

redis.call('LTRIM', PACK, count, -1)
local gone, lost = 0, 0
if redis.call('LLEN', PACK) == 0 then
    -- Every message of the pack was in its list: a count above the records found, whole or damaged, is messages
    -- lost (a list deleted or cut short by hand), said and counted rather than dropped in silence.
    lost = math.max(0, counts.live - live_taken - orphaned)
    redis.call('HDEL', PACK_BASE, name)
    redis.call('HDEL', PACK_LIVE, name)
    redis.call('ZREM', PACKS, name)
    gone = 1
else
    redis.call('HINCRBY', PACK_BASE, name, count)
    -- A record without its index entry was a message of the count all the same.
    redis.call('HINCRBY', PACK_LIVE, name, -live_taken - orphaned)
end
if moved > 0 then
    redis.call('HINCRBY', STATS, 'opened', moved)
end
if unreadable > 0 then
    redis.call('HINCRBY', STATS, 'pack_unreadable', unreadable)
end
count_damage(STATS, damaged + lost)
local woke = 0
if earliest and (not head or earliest < head) then
    wake_one(WAKE)
    woke = 1
end
return {moved, dead, gone, woke, damaged, lost}
