-- schedule_update.lua: change the stored definition of a runtime schedule, in step with its record.
-- KEYS: shard 0's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   SCHEDULES      HASH schedule name -> definition (JSON, written and read by delay_broker.schedules)
--   SCHEDULES_REV  STRING revision of SCHEDULES, incremented by every change (schedulers re-read on a change)
--   CRON           HASH schedule name -> due ms of the latest occurrence parked for it
--   DUE            ZSET id -> score (the schedule's parked occurrence may be cancelled)
--   MSG            HASH id -> envelope
--   STATS          HASH counters
--   WAKE           LIST wake marker (a change wakes a promoter, which re-reads the schedules at once)
--   PACKS          ZSET pack name -> earliest due ms of its records (see park.lua): the occurrence may be
--                  packed
--   PACK_BASE      HASH pack name -> records taken from its head
--   PACK_LIVE      HASH pack name -> messages packed in it
--   PACKED_SHAPE   STRING the packed index's shape
-- KEYS after the shard's, with an ARGV[6] id (id_keys): its packed index partition and the pack it is said to
--   be in
-- ARGV[1] name
-- ARGV[2] definition: JSON text to store, or '' to delete the schedule's definition
-- ARGV[3] expected revision: what the caller read SCHEDULES at ('' skips the check)
-- ARGV[4] expected record: the CRON value the caller read ('' when there was none)
-- ARGV[5] record: 'keep'; 'rewind' (the latest occurrence becomes now: the next one parked is the first after
--         now, and none before now is caught up); 'drop' (delete it, and the record named by ARGV[7]). A rewind
--         leaves a record that is later than now when the occurrence it names may still be parked: not cancelled
--         here, and ARGV[6] is '' or names a message still held (a record below a parked occurrence would let a
--         scheduler park it again once it ran)
-- ARGV[6] id of the schedule's latest occurrence, cancelled if it is still parked and not yet due ('' none)
-- ARGV[7] name of a second record deleted with 'drop' ('' none)
-- ARGV[8] name of the record that keeps when the record was rewound: set to now by 'rewind', deleted by 'drop'
--         (while it equals the record, no occurrence was parked since the change)
-- ARGV[9] .. ARGV[12]: the packed index's shape, the 16-byte form and packed location of the ARGV[6] id, if
--         any, and the key map (see by_id_trailer and id_keys)
-- Returns {1, revision, now, cancelled (1/0)}, or {0, current revision, now, 0} when the revision or the record
-- changed since the caller read them (nothing was changed; read again and retry); or a refusal, having written
-- nothing.

local name = ARGV[1]
local now = now_ms()
local keys = id_keys(ARGV[6] ~= '' and 1 or 0, 2)
local problem = denied_command()
    or wrong_type(SCHEDULES, 'hash', SCHEDULES_REV, 'string', CRON, 'hash', DUE, 'zset', MSG, 'hash',
        STATS, 'hash', WAKE, 'list', PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash')
    or id_keys_wrong_type(keys)
if problem then
    return problem
end
local shape, binaries, locations = by_id_trailer()
local places, stale
places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if problem then
    return problem
end

local revision = tonumber(redis.call('GET', SCHEDULES_REV) or '0')
if not revision then
    return redis.error_reply('ERR key ' .. SCHEDULES_REV .. ' is not an integer counter: nothing was changed; '
        .. 'delete it to let delay_broker go on')
end
local record = redis.call('HGET', CRON, name) or ''
if (ARGV[3] ~= '' and tonumber(ARGV[3]) ~= revision) or record ~= ARGV[4] then
    return {0, revision, now, 0}
end

drop_stale(stale, STATS)
local cancelled = 0
local id = ARGV[6]
local packed_held = false
if places[1] then
    local due = packed_due(places[1].record)
    if due and due > now then
        pack_take(places[1], PACKS, PACK_BASE, PACK_LIVE)
        redis.call('HINCRBY', STATS, 'cancelled', 1)
        cancelled = 1
    else
        packed_held = true
    end
elseif id ~= '' then
    local score = redis.call('ZSCORE', DUE, id)
    if score and due_of(score) > now then
        redis.call('ZREM', DUE, id)
        redis.call('HDEL', MSG, id)
        redis.call('HINCRBY', STATS, 'cancelled', 1)
        cancelled = 1
    end
end

if ARGV[2] == '' then
    redis.call('HDEL', SCHEDULES, name)
else
    redis.call('HSET', SCHEDULES, name, ARGV[2])
end
local latest = string.match(record, '^%d+$') and tonumber(record)
local held = latest and latest > now and cancelled == 0
    and (id == '' or packed_held or redis.call('HEXISTS', MSG, id) == 1)
if ARGV[5] == 'rewind' and not held then
    redis.call('HSET', CRON, name, now)
    if ARGV[8] ~= '' then
        redis.call('HSET', CRON, ARGV[8], now)
    end
elseif ARGV[5] == 'drop' then
    redis.call('HDEL', CRON, name)
    for i = 7, 8 do
        if ARGV[i] ~= '' then
            redis.call('HDEL', CRON, ARGV[i])
        end
    end
end
revision = redis.call('INCRBY', SCHEDULES_REV, 1)
wake_one(WAKE)
return {1, revision, now, cancelled}
