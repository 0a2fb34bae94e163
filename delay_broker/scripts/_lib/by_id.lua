-- by_id.lua: what the scripts that act on messages by id share: the keys and arguments they are given for their
-- ids (see delay_broker.store.runner.Runner.by_id), where each id is packed, and what the store holds of an id.
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none of its own; by_id_trailer reads the last three.

-- The keys of `count` ids, `stride` per id: its packed index partition, the pack the caller says it is in, and
-- (stride 3, parks) the pack it may be appended to. The keys after the shard's are each given once (1,000 ids
-- share a partition or two and rarely a pack); the last ARGV maps each id's keys to them, a little-endian u16
-- per key, counted from the first key after the shard's.
local function id_keys(count, stride)
    local map, byte = ARGV[#ARGV], string.byte
    local keys = {}
    for n = 1, count do
        local at = (n - 1) * stride * 2
        local a, b, c, d, e, f = byte(map, at + 1, at + stride * 2)
        keys[n] = {partition = KEYS[FIRST_EXTRA_KEY + a + b * 256], pack = KEYS[FIRST_EXTRA_KEY + c + d * 256],
            target = e and KEYS[FIRST_EXTRA_KEY + e + f * 256]}
    end
    return keys
end

-- The by-id scripts' ARGV before the key map (see id_keys): the packed index's shape the caller placed the ids
-- by, the ids' 16-byte forms run together (16 zero bytes for an id never packed), and their packed locations,
-- space-separated ('-' for none).
local function by_id_trailer()
    return ARGV[#ARGV - 3], ARGV[#ARGV - 2], ARGV[#ARGV - 1]
end

-- The 16-byte form of the id at `position` in the trailer's run.
local function binary_at(binaries, position)
    return string.sub(binaries, position * 16 - 15, position * 16)
end

-- wrong_type for the partitions (hashes) and packs (lists; PACKS stands for none) of id_keys.
local function id_keys_wrong_type(keys)
    local spec = {}
    for _, key in ipairs(keys) do
        for _, name in ipairs({key.partition, key.pack, key.target}) do
            spec[#spec + 1] = name
            spec[#spec + 1] = string.find(name, ':packed:%d+$') and 'hash'
                or string.find(name, ':pack:%d+:%d+$') and 'list' or 'zset'
        end
    end
    return wrong_type(unpack(spec))
end

-- Where each id is packed, checked against where the caller says (keys: id_keys; the rest: by_id_trailer and
-- the shard's PACK_BASE, PACK_LIVE and PACKED_SHAPE). Returns, by id position, its place (false when not
-- packed): {key = its pack's key, name = the pack's name, position, record, partition, binary, counts = the
-- pack's pack_counts}; and the index entries that point at no record of their id ({partition, binary} each:
-- damage, no entry for every reader, removed by a script that writes). Or nil, nil and a refusal, having read
-- only: 'RESHAPED level:split' when the index was split so that an id is in another partition than the one
-- given, 'PACKED n location ...' naming where the ids that are elsewhere are now (the caller calls again with
-- those), or a pack whose bookkeeping is damaged.
local function pack_locate(keys, shape, binaries, expected, base_key, live_key, shape_key)
    local none = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
    local current, level, split = index_shape(shape_key)
    if not current then
        return nil, nil, damaged(level)
    end
    if current ~= shape then
        for position, key in ipairs(keys) do
            local binary = binary_at(binaries, position)
            local given = string.match(key.partition, ':packed:(%d+)$')
            if binary ~= none and tonumber(given) ~= index_partition(binary, level, split) then
                return nil, nil, redis.error_reply('RESHAPED ' .. current)
            end
        end
    end
    local found, stale, moved = {}, {}, {}
    local position = 0
    for location in string.gmatch(expected, '%S+') do
        position = position + 1
        found[position] = false
        local binary = binary_at(binaries, position)
        local key = keys[position]
        if key and #binary == 16 and binary ~= none then
            local at = redis.call('HGET', key.partition, binary)
            local name, offset, text = parse_location(at)
            if name and text ~= location then
                moved[#moved + 1] = position .. ' ' .. text
            elseif name then
                local counts, problem = pack_counts(base_key, live_key, name)
                if not counts then
                    return nil, nil, damaged(problem)
                end
                local record = offset >= counts.base and redis.call('LINDEX', key.pack, offset - counts.base)
                if record and string.sub(record, 1, 16) == binary then
                    found[position] = {key = key.pack, name = name, position = offset, record = record,
                        partition = key.partition, binary = binary, counts = counts}
                else
                    stale[#stale + 1] = {key.partition, binary}
                end
            else
                if at then
                    stale[#stale + 1] = {key.partition, binary}
                end
                if location ~= '-' then
                    moved[#moved + 1] = position .. ' -'
                end
            end
        end
    end
    if position ~= #keys then
        return nil, nil, redis.error_reply('ERR delay_broker: ' .. position .. ' packed locations for ' .. #keys
            .. ' ids')
    end
    if #moved > 0 then
        return nil, nil, redis.error_reply('PACKED ' .. table.concat(moved, ' '))
    end
    return found, stale, nil
end

-- Removes the index entries pack_locate found pointing at no record of their id, and counts them as damage
-- ('pack_damaged': only a hand-made change makes one).
local function drop_stale(stale, stats_key)
    for _, entry in ipairs(stale) do
        redis.call('HDEL', entry[1], entry[2])
    end
    count_damage(stats_key, #stale)
end

-- Whether the store holds `id` outside the packs: every parked, leased or dead message has its envelope in MSG,
-- but a dead letter whose envelope had gone missing, which is in DEAD alone. A new id costs two lookups.
local function held_unpacked(id, msg_key, dead_key)
    return redis.call('HEXISTS', msg_key, id) == 1 or redis.call('ZSCORE', dead_key, id) ~= false
end

-- What the store holds of `id`: its due time when parked (packed, at `place`, or in DUE), -1 when it is in
-- flight or dead, false when nothing (an envelope in MSG with no index is nothing: a hand-made change).
local function held_due(id, place, msg_key, due_key, inflight_key, dead_key)
    if place then
        return packed_due(place.record) or -1
    elseif not held_unpacked(id, msg_key, dead_key) then
        return false
    end
    local score = redis.call('ZSCORE', due_key, id)
    if score then
        return due_of(score)
    elseif redis.call('ZSCORE', inflight_key, id) or redis.call('ZSCORE', dead_key, id) then
        return -1
    end
    return false
end
