-- packs.lua: packed records and their bookkeeping (see delay_broker/packing.py).
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none.

-- Packed records: the id's 16 bytes, the due time in 6 bytes (big-endian ms), then the envelope as MSG holds it.
-- A record taken out by id is cleared in place (an empty string), so that the positions of the others stay
-- what the packed index says.
local PACK_HEADER = 22

-- Entries past which a partition of the packed index asks for a split. Must equal
-- delay_broker.packing.SPLIT_AT.
local SPLIT_AT = 128

-- `n` (below 2^48) in 6 big-endian bytes.
local function u48_text(n)
    return struct.pack('>I2I4', math.floor(n / 4294967296), n % 4294967296)
end

-- The due time of a packed record, or nil when the record is too short to hold one.
local function packed_due(record)
    local a, b, c, d, e, f = string.byte(record, 17, 22)
    if not f then
        return nil
    end
    return ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end

-- A location as the packed index holds it (12 bytes: the pack's width and slot and the record's position, each
-- a big-endian u32): the pack's name ('width:slot'), the position, and the location as text
-- ('width:slot:position', as callers give and take it); nil for anything else.
local function parse_location(value)
    if not value or #value ~= 12 then
        return nil
    end
    local width, slot, position = struct.unpack('>I4I4I4', value)
    local name = width .. ':' .. slot
    return name, position, name .. ':' .. position
end

-- The index's 12 bytes for a record of pack `name` at `position`. struct.pack would wrap a number past 2^32
-- silently, and the entry would point at another pack (packing.pack_name keeps names within it).
local function location_value(name, position)
    local width, slot = string.match(name, '^(%d+):(%d+)$')
    width, slot = tonumber(width), tonumber(slot)
    if not width or width >= 4294967296 or slot >= 4294967296 or position >= 4294967296 then
        error('pack name or position out of range: ' .. tostring(name) .. ':' .. tostring(position))
    end
    return struct.pack('>I4I4I4', width, slot, position)
end

-- Counts `count` pieces of damage found ('pack_damaged'), best effort: a counter must never fail a script that
-- has written already.
local function count_damage(stats_key, count)
    if count > 0 then
        redis.pcall('HINCRBY', stats_key, 'pack_damaged', count)
    end
end

-- The refusal of a script that found a pack's bookkeeping damaged (a hand-made change): it has changed nothing.
local function damaged(what)
    return redis.error_reply('DAMAGED ' .. what .. ': nothing was changed; run `delay-broker check` to see the '
        .. 'damage and `delay-broker check --repair` to mend what can be')
end

-- The bookkeeping of the packs a call has read, by name: one table per pack, shared by every place and target
-- of the call, so that a pack dropped by pack_take is seen empty by a later append (scripts run afresh at
-- every call, so this starts empty at every call).
local PACK_COUNTS = {}

-- A pack's bookkeeping, read before anything is written: the records taken from its head (PACK_BASE) and the
-- messages still in it (PACK_LIVE), 0 when absent; or nil and what is wrong when either is not a whole number
-- (positions or a count computed from it would lose messages, or fail a script half-way).
local function pack_counts(base_key, live_key, name)
    local known = PACK_COUNTS[name]
    if known then
        return known
    end
    local base = redis.call('HGET', base_key, name) or '0'
    local live = redis.call('HGET', live_key, name) or '0'
    if not string.match(base, '^%d+$') then
        return nil, 'pack ' .. name .. ' has a malformed base in ' .. base_key .. ': ' .. string.sub(base, 1, 40)
    elseif not string.match(live, '^%d+$') then
        return nil, 'pack ' .. name .. ' has a malformed count in ' .. live_key .. ': ' .. string.sub(live, 1, 40)
    end
    known = {base = tonumber(base), live = tonumber(live)}
    PACK_COUNTS[name] = known
    return known
end

-- The partition of the packed index a 16-byte id is in, for the shape 'level:split' (see
-- delay_broker/packing.py: its hash modulo 2^level, or modulo 2^(level + 1) below split).
local function index_partition(binary, level, split)
    if level == 0 and split == 0 then
        return 0  -- one partition: no hash needed
    end
    local hashed = tonumber(string.sub(redis.sha1hex(binary), 1, 8), 16)
    local partition = hashed % 2 ^ level
    if partition < split then
        partition = hashed % 2 ^ (level + 1)
    end
    return partition
end

-- The packed index's shape as stored: its text ('0:0' when absent), level and split; or nil and what is wrong
-- when it is malformed (every id would be looked for in the wrong partition).
local function index_shape(shape_key)
    local text = redis.call('GET', shape_key) or '0:0'
    local level, split = string.match(text, '^(%d+):(%d+)$')
    level, split = tonumber(level), tonumber(split)
    if not level or level > 30 or split >= 2 ^ level then
        return nil, 'the packed index shape in ' .. shape_key .. ' is malformed: ' .. string.sub(text, 1, 40)
    end
    return text, level, split
end

-- Wakes a promoter when one of the packs `earlier` (a set of names whose earliest due time just went down) is
-- now the first to open. A promoter looks at packs on a timer set by its own pack_after: a producer with a
-- shorter one makes packs due before that timer ends. Called after the writes, so a WAKE of the wrong type
-- skips the wake (the timer still opens the pack) rather than failing a park that is done. Returns whether it
-- woke one.
local function wake_for_pack(packs_key, earlier, wake_key)
    if not earlier[redis.call('ZRANGE', packs_key, 0, 0)[1]] then
        return false
    end
    local kind = redis.call('TYPE', wake_key)['ok']
    if kind ~= 'list' and kind ~= 'none' then
        return false
    end
    wake_one(wake_key)
    return true
end

-- A pack a park may append to (`key`, `name`): its pack_counts, with its earliest due time (false for a pack not
-- in PACKS) read into them; or nil and what is wrong with its bookkeeping. Read before anything is written.
local function pack_target(packs_key, base_key, live_key, key, name)
    local counts, problem = pack_counts(base_key, live_key, name)
    if not counts then
        return nil, problem
    end
    if counts.earliest == nil then
        local earliest = redis.call('ZSCORE', packs_key, name)
        counts.earliest = earliest and tonumber(earliest) or false
    end
    return {key = key, name = name, counts = counts}
end

-- Appends a message to a pack (a pack_target): its record at the pack's tail, its entry in the index
-- partition, the pack's earliest due time and count. The record is the first write (over maxmemory, the one
-- Redis refuses; and a pack key of the wrong type fails it), every other key was read before. Returns the
-- record's position and whether the pack's earliest due time went down (the caller may wake a promoter:
-- wake_for_pack).
local function pack_append(target, partition, binary, due, envelope, packs_key, live_key)
    local counts = target.counts
    local position = counts.base + redis.call('RPUSH', target.key, binary .. u48_text(due) .. envelope) - 1
    redis.call('HSET', partition, binary, location_value(target.name, position))
    local earlier = not counts.earliest or due < counts.earliest
    if earlier then
        redis.call('ZADD', packs_key, due, target.name)
        counts.earliest = due
    end
    redis.call('HINCRBY', live_key, target.name, 1)
    return position, earlier
end

-- Takes a located message (a place of pack_locate) out of its pack: its record is cleared, its index entry
-- removed, and a pack left with no message is dropped whole (then true is returned).
local function pack_take(place, packs_key, base_key, live_key)
    redis.call('LSET', place.key, place.position - place.counts.base, '')
    redis.call('HDEL', place.partition, place.binary)
    -- Exactly none left: a count that drifted below the messages still packed must not drop them.
    if redis.call('HINCRBY', live_key, place.name, -1) == 0 then
        redis.call('DEL', place.key)
        redis.call('HDEL', base_key, place.name)
        redis.call('HDEL', live_key, place.name)
        redis.call('ZREM', packs_key, place.name)
        -- An append to it later in the call starts it afresh.
        place.counts.base, place.counts.live, place.counts.earliest = 0, 0, false
        return true
    end
    return false
end
