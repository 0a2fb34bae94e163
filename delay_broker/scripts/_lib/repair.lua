-- repair.lua: what the scripts of `delay-broker check --repair` share (see delay_broker/store/checking.py): each
-- takes items the check found, re-checks each against what the check read, and mends it only if it is still so.
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none of its own; repair_items reads the first three.

-- The name of the pack whose LIST is `key` ('width:slot'), or nil for a key that is not a pack's.
local function pack_name_of(key)
    return string.match(key, '}:pack:(%d+:%d+)$')
end

-- The record the index entry `value` of the 16-byte id `binary` points at, when it is a record of that id; false
-- when the entry points at none (no location, the pack gone, a position outside it, another id there); nil when
-- that cannot be told (`pack_key`, the caller's key for the pack the entry names, is another pack's, or the
-- pack's bookkeeping is malformed): the caller then leaves the item alone.
local function entry_record(value, binary, pack_key, base_key, live_key)
    local name, position = parse_location(value)
    if not name then
        return false
    end
    if pack_name_of(pack_key) ~= name then
        return nil
    end
    local counts = pack_counts(base_key, live_key, name)
    if not counts then
        return nil
    end
    local record = position >= counts.base and redis.call('LINDEX', pack_key, position - counts.base)
    if record and string.sub(record, 1, 16) == binary then
        return record
    end
    return false
end

-- Whether `partition` (a key) is the partition of the packed index the 16-byte id `binary` belongs in, for the
-- shape `level`, `split`.
local function own_partition(partition, binary, level, split)
    return tonumber(string.match(partition, ':packed:(%d+)$')) == index_partition(binary, level, split)
end

-- The frame of a repair call of `items` items: whether it only checks (ARGV[1] 'check': reads, writes nothing),
-- and the packed index's level and split; ARGV[2] is the kind of repair, ARGV[3] the shape as the check read it.
-- Or nil, nil, nil and the reply to return instead: the refusal when the user may not run a command the repair
-- calls, or 'changed meanwhile' for every item when the stored shape is no longer that one (unless `any_shape`:
-- repairs that place no id in a partition).
local function repair_items(shape_key, items, any_shape)
    local checking = ARGV[1] == 'check'
    local problem = not checking and denied_command()
    if problem then
        return nil, nil, nil, problem
    end
    local shape, level, split = index_shape(shape_key)
    if shape ~= ARGV[3] and not any_shape then
        local unchanged = {}
        for n = 1, items do
            unchanged[n] = 0
        end
        return nil, nil, nil, unchanged
    end
    return checking, level, split
end

-- wrong_type for the keys after the shard's of `items` items, `stride` each: partitions of the packed index are
-- hashes, packs lists; any other key (one that stands for none) is not touched by the repairs.
local function item_keys_wrong_type(items, stride)
    local spec = {}
    for n = FIRST_EXTRA_KEY, FIRST_EXTRA_KEY + items * stride - 1 do
        local key = KEYS[n]
        if string.find(key, '}:packed:%d+$') then
            spec[#spec + 1] = key
            spec[#spec + 1] = 'hash'
        elseif string.find(key, '}:pack:', 1, true) then
            spec[#spec + 1] = key
            spec[#spec + 1] = 'list'
        end
    end
    return wrong_type(unpack(spec))
end
