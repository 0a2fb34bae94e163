-- repair_record.lua: clear packed records that `delay-broker check` found to be no message of their pack (see
-- delay_broker/store/checking.py), each only if it is still as the check read it. A record is never cleared
-- while its id's index entry points at it.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   MSG       HASH id -> envelope ('held': the id is parked, in flight or dead outside the packs)
--   DEAD      ZSET id -> dead-lettered at (likewise)
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape
-- KEYS after the shard's, three per item: the pack; the partition the record's id belongs in by the shape ARGV[3]
--   (any other key of the shard's for a record too short for an id); the pack its id's entry points at (any
--   other key for none)
-- ARGV[1] 'check' (reads only: which items are still as read) or 'repair'
-- ARGV[2] 'clear'
-- ARGV[3] the packed index's shape the check read
-- ARGV[4..] four per item: the record's position (counted from the pack's first record), its length and first
--   16 bytes as read (fewer for a shorter record), and why it goes: 'duplicate' (its id's entry points at
--   another record of the id: a stale copy), 'held' (the store holds its id outside the packs, which wins as
--   when the pack is opened), 'unreadable' (too short for an id or an envelope, and no entry points at it)
-- Returns per item 1 (as read: cleared, unless checking) or 0 (changed meanwhile: left alone); or a refusal,
-- having written nothing. A cleared record is an empty string, as one taken out by id: positions stay.

local count = (#ARGV - 3) / 4
if ARGV[2] ~= 'clear' then
    return redis.error_reply('ERR delay_broker: no record repair ' .. ARGV[2])
end
local checking, level, split, reply = repair_items(PACKED_SHAPE, count)
if reply then
    return reply
end
local problem = wrong_type(MSG, 'hash', DEAD, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash')
    or item_keys_wrong_type(count, 3)
if problem then
    return problem
end

-- Whether the record (its 16-byte id `head`) at `position` of pack `name` is still no message: its id's entry
-- points elsewhere (at another record of the id for 'duplicate'), and 'held' or 'unreadable' still holds.
local function still_extra(name, position, head, length, own, entry_pack, why)
    if #head < 16 then
        return why == 'unreadable'
    end
    if not own_partition(own, head, level, split) then
        return false
    end
    local entry = redis.call('HGET', own, head)
    if entry == location_value(name, position) then
        return false
    elseif why == 'duplicate' then
        return entry and entry_record(entry, head, entry_pack, PACK_BASE, PACK_LIVE) and true or false
    elseif why == 'held' then
        return held_unpacked(uuid_text(head, 1), MSG, DEAD)
    end
    return why == 'unreadable' and length <= PACK_HEADER
end

local function clear(pack, own, entry_pack, position, length, head, why)
    local name = pack_name_of(pack)
    local counts = name and pack_counts(PACK_BASE, PACK_LIVE, name)
    if not counts or position < counts.base or position >= 4294967296 or length == 0 then
        return 0
    end
    local record = redis.call('LINDEX', pack, position - counts.base)
    if not record or #record ~= length or string.sub(record, 1, 16) ~= head
            or not still_extra(name, position, head, length, own, entry_pack, why) then
        return 0
    end
    if not checking then
        redis.call('LSET', pack, position - counts.base, '')
    end
    return 1
end

local done = {}
for n = 1, count do
    local at, arg = FIRST_EXTRA_KEY + (n - 1) * 3, 4 + (n - 1) * 4
    done[n] = clear(KEYS[at], KEYS[at + 1], KEYS[at + 2], tonumber(ARGV[arg]), tonumber(ARGV[arg + 1]),
        ARGV[arg + 2], ARGV[arg + 3])
end
return done
