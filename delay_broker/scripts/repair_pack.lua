-- repair_pack.lua: mend the bookkeeping of packs that `delay-broker check` found wrong (see
-- delay_broker/store/checking.py), each only if the pack is still as the check read it.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape ('base' checks an entry)
-- KEYS after the shard's, two per item: the pack; for 'base' the partition of the id it is checked by (any other
--   key of the shard's otherwise)
-- ARGV[1] 'check' (reads only: which items are still as read) or 'repair'
-- ARGV[2] the repair, ARGV[3] the packed index's shape the check read, ARGV[4..] five per item ('' unused):
--   'count': PACK_LIVE's field as read ('' for none), PACK_BASE's, the list's length and the SHA-1 of its last
--     record as read, the count to set. Whatever a park, an open or a take does to a pack changes one of these.
--   'base': PACK_BASE's field as read, the base to set, the list index of a record whose id's entry shows that
--     base (-1 for none: only a malformed base is set then, and nothing moves a pack whose base is malformed),
--     that record's 16-byte id
--   'list': the earliest due time to list a pack PACKS lacks with (a park into it meanwhile lists it)
--   'earliest': PACKS's earliest due time as read, a sooner one (the pack's earliest record)
--   'forget': for a pack whose list is gone, PACKS's earliest as read ('' for none), PACK_BASE's and
--     PACK_LIVE's fields as read: all three are removed
-- Returns per item 1 (as read: mended, unless checking) or 0 (changed meanwhile: left alone); or a refusal,
-- having written nothing.

local count = (#ARGV - 3) / 5
local mode = ARGV[2]
if not ({count = true, base = true, list = true, earliest = true, forget = true})[mode] then
    return redis.error_reply('ERR delay_broker: no pack repair ' .. mode)
end
local checking, level, split, reply = repair_items(PACKED_SHAPE, count, mode ~= 'base')
if reply then
    return reply
end
local problem = wrong_type(PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash') or item_keys_wrong_type(count, 2)
if problem then
    return problem
end

local function field(key, name)
    return redis.call('HGET', key, name) or ''
end

local function set_count(pack, name, live, base, length, tail, new)
    if field(PACK_LIVE, name) ~= live or field(PACK_BASE, name) ~= base
            or redis.call('LLEN', pack) ~= tonumber(length)
            or redis.sha1hex(redis.call('LINDEX', pack, -1) or '') ~= tail then
        return 0
    end
    if not checking then
        redis.call('HSET', PACK_LIVE, name, new)
    end
    return 1
end

local function set_base(pack, own, name, base, new, index, binary)
    if field(PACK_BASE, name) ~= base then
        return 0
    end
    if index < 0 then
        if string.match(base, '^%d+$') then
            return 0
        end
    else
        local record = redis.call('LINDEX', pack, index)
        if not record or string.sub(record, 1, 16) ~= binary or not own_partition(own, binary, level, split)
                or redis.call('HGET', own, binary) ~= location_value(name, new + index) then
            return 0
        end
    end
    if not checking then
        redis.call('HSET', PACK_BASE, name, new)
    end
    return 1
end

local function listed(name)
    local score = redis.call('ZSCORE', PACKS, name)
    return score and tonumber(score)
end

local function forget(pack, name, earliest, base, live)
    if redis.call('EXISTS', pack) == 1 or listed(name) ~= (earliest ~= '' and tonumber(earliest) or false)
            or field(PACK_BASE, name) ~= base or field(PACK_LIVE, name) ~= live then
        return 0
    end
    if not checking then
        redis.call('ZREM', PACKS, name)
        redis.call('HDEL', PACK_BASE, name)
        redis.call('HDEL', PACK_LIVE, name)
    end
    return 1
end

local function list(pack, name, earliest, sooner)
    local ok
    if mode == 'list' then
        ok = not listed(name) and redis.call('LLEN', pack) > 0
    else
        ok = listed(name) == tonumber(earliest) and tonumber(sooner) < tonumber(earliest)
    end
    if not ok then
        return 0
    end
    if not checking then
        redis.call('ZADD', PACKS, mode == 'list' and earliest or sooner, name)
    end
    return 1
end

local done = {}
for n = 1, count do
    local at, arg = FIRST_EXTRA_KEY + (n - 1) * 2, 4 + (n - 1) * 5
    local pack, a, b, c, d, e = KEYS[at], ARGV[arg], ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3], ARGV[arg + 4]
    local name = mode == 'forget' and string.match(pack, '}:pack:(.+)$') or pack_name_of(pack)
    if not name then
        done[n] = 0
    elseif mode == 'count' then
        done[n] = set_count(pack, name, a, b, c, d, e)
    elseif mode == 'base' then
        done[n] = set_base(pack, KEYS[at + 1], name, a, tonumber(b), tonumber(c), d)
    elseif mode == 'forget' then
        done[n] = forget(pack, name, a, b, c)
    else
        done[n] = list(pack, name, a, b)
    end
end
return done
