-- split_index.lua: split the next partitions in line of the packed index in two (linear hashing; see
-- delay_broker/packing.py), so that each stays small. Parks that fill a partition ask for it.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   PACKED_SHAPE  STRING the packed index's shape ('level:split', '0:0' when absent)
-- KEYS after the shard's, two per split: the partition split and the partition it makes, in the order the
--   splits are made from the shape ARGV[1]
-- ARGV[1] the shape the caller chose those partitions by
-- ARGV[2] splits to make
-- Returns {1, the shape after the splits}; or {0, the stored shape}, nothing changed, when it is not ARGV[1]
-- (another process split meanwhile; a park asks again if still needed).

local shape, level, split = index_shape(PACKED_SHAPE)
if not shape then
    return damaged(level)
end
if shape ~= ARGV[1] then
    return {0, shape}
end
local count = tonumber(ARGV[2])
local spec = {PACKED_SHAPE, 'string'}
for n = 1, 2 * count do
    spec[#spec + 1] = KEYS[FIRST_EXTRA_KEY + n - 1]
    spec[#spec + 1] = 'hash'
end
local problem = denied_command() or wrong_type(unpack(spec))
if problem then
    return problem
end
-- The partitions given are those the splits from ARGV[1] touch, checked before any is made.
local at_level, at_split = level, split
for n = 1, count do
    local old, new = KEYS[FIRST_EXTRA_KEY + 2 * n - 2], KEYS[FIRST_EXTRA_KEY + 2 * n - 1]
    if tonumber(string.match(old, ':packed:(%d+)$')) ~= at_split
        or tonumber(string.match(new, ':packed:(%d+)$')) ~= at_split + 2 ^ at_level then
        return redis.error_reply('ERR delay_broker: split ' .. n .. ' given partitions ' .. old .. ' and ' .. new
            .. ', not those of shape ' .. at_level .. ':' .. at_split)
    end
    at_split = at_split + 1
    if at_split == 2 ^ at_level then
        at_level, at_split = at_level + 1, 0
    end
end
for n = 1, count do
    local old, new = KEYS[FIRST_EXTRA_KEY + 2 * n - 2], KEYS[FIRST_EXTRA_KEY + 2 * n - 1]
    local entries = redis.call('HGETALL', old)
    local halves = {{}, {}}
    for i = 1, #entries, 2 do
        -- Its hash modulo 2^(level + 1) is this partition or the new one.
        local half = halves[index_partition(entries[i], level + 1, 0) == split and 1 or 2]
        half[#half + 1] = entries[i]
        half[#half + 1] = entries[i + 1]
    end
    -- Both written afresh: a partition a large batch filled past Redis's listpack limit became a hash table,
    -- which Redis never turns back; written anew, each half is compact again.
    redis.call('DEL', old)
    for half, key in pairs({old, new}) do
        for i = 1, #halves[half], 1000 do
            redis.call('HSET', key, unpack(halves[half], i, math.min(i + 999, #halves[half])))
        end
    end
    split = split + 1
    if split == 2 ^ level then
        level, split = level + 1, 0
    end
end
shape = level .. ':' .. split
redis.call('SET', PACKED_SHAPE, shape)
return {1, shape}
