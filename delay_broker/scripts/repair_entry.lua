-- repair_entry.lua: mend entries of the packed index that `delay-broker check` found wrong (see
-- delay_broker/store/checking.py), each only if it is still as the check read it.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   MSG       HASH id -> envelope (an id held there is never pointed at a packed record)
--   DEAD      ZSET id -> dead-lettered at (likewise)
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's, four per item: the partition the entry is in; the partition its id belongs in by the
--   shape ARGV[3]; the pack the entry points at; the pack of the item's other location (any other key of the
--   shard's for none)
-- ARGV[1] 'check' (reads only: which items are still as read) or 'repair'
-- ARGV[2] 'move': an entry in a partition not its id's goes to its own, unless that one holds an entry pointing
--           at a record of the id (then it is deleted: the record it pointed at is a stale copy)
--         'point': the id's entry (none, or one pointing at no record of the id) is pointed at a record of the
--           id found in a pack (an orphaned record indexed, a broken entry re-pointed), unless the store holds
--           the id outside the packs
--         'drop': an entry pointing at no record of its id is deleted
-- ARGV[3] the packed index's shape the check read
-- ARGV[4..] three per item: the id's 16 bytes, the entry as read ('' for none: 'point' only), and the other
--   location: for 'move' the entry of the id's own partition as read ('' for none), for 'point' the location
--   to point at, for 'drop' unused
-- Returns per item 1 (as read: mended, unless checking) or 0 (changed meanwhile: left alone); or a refusal,
-- having written nothing.

local count = (#ARGV - 3) / 3
local mode = ARGV[2]
if mode ~= 'move' and mode ~= 'point' and mode ~= 'drop' then
    return redis.error_reply('ERR delay_broker: no entry repair ' .. mode)
end
local checking, level, split, reply = repair_items(PACKED_SHAPE, count)
if reply then
    return reply
end
local problem = wrong_type(MSG, 'hash', DEAD, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash')
    or item_keys_wrong_type(count, 4)
if problem then
    return problem
end

local function move(binary, value, other, from, own, pack, other_pack)
    if from == own or not own_partition(own, binary, level, split) or redis.call('HGET', from, binary) ~= value
            or (redis.call('HGET', own, binary) or '') ~= other then
        return 0
    end
    local keep = value
    if other ~= '' and other ~= value then
        -- Two entries: the one pointing at a record of the id stays; the other's record is then a stale copy.
        local held = entry_record(other, binary, other_pack, PACK_BASE, PACK_LIVE)
        local mine = held == false and entry_record(value, binary, pack, PACK_BASE, PACK_LIVE)
        if held == nil or mine == nil then
            return 0
        end
        keep = mine and value or nil
    end
    if not checking then
        if keep and keep ~= other then
            redis.call('HSET', own, binary, keep)
        end
        redis.call('HDEL', from, binary)
    end
    return 1
end

local function point(binary, value, target, own, pack, target_pack)
    if not own_partition(own, binary, level, split) or (redis.call('HGET', own, binary) or '') ~= value
            or value ~= '' and entry_record(value, binary, pack, PACK_BASE, PACK_LIVE) ~= false then
        return 0
    end
    local record = entry_record(target, binary, target_pack, PACK_BASE, PACK_LIVE)
    -- An id parked again outside the packs: that later park wins (as when a pack is opened), never two copies.
    if not record or #record <= PACK_HEADER or held_unpacked(uuid_text(binary, 1), MSG, DEAD) then
        return 0
    end
    if not checking then
        redis.call('HSET', own, binary, target)
    end
    return 1
end

local function drop(binary, value, from, pack)
    if redis.call('HGET', from, binary) ~= value or entry_record(value, binary, pack, PACK_BASE, PACK_LIVE) ~= false then
        return 0
    end
    if not checking then
        redis.call('HDEL', from, binary)
    end
    return 1
end

local done = {}
for n = 1, count do
    local at, arg = FIRST_EXTRA_KEY + (n - 1) * 4, 4 + (n - 1) * 3
    local from, own, pack, other_pack = KEYS[at], KEYS[at + 1], KEYS[at + 2], KEYS[at + 3]
    local binary, value, other = ARGV[arg], ARGV[arg + 1], ARGV[arg + 2]
    if mode == 'move' then
        done[n] = move(binary, value, other, from, own, pack, other_pack)
    elseif mode == 'point' then
        done[n] = point(binary, value, other, own, pack, other_pack)
    else
        done[n] = drop(binary, value, from, pack)
    end
end
return done
