-- park_occurrence.lua: park one occurrence of a recurring schedule, only when it is due later than every
-- occurrence ever parked for that schedule: any number of schedulers may offer the same occurrence, before or
-- after it was promoted, and it runs once.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude (shard 0). Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   LEASED    HASH id -> due score while in flight
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   WAKE      LIST wake marker
--   STATS     HASH counters ('parked', 'replaced', 'promoted'; 'pack_damaged')
--   CRON      HASH schedule name -> due ms of the latest occurrence parked for it (decimal digits only; any
--             other value is a malformed record, refused)
--   SCHEDULES_REV  STRING revision of the runtime schedules' definitions
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape (see pack_locate)
-- KEYS after the shard's (id_keys): the id's packed index partition, the pack the caller says it is in, the pack
--   to append it to if it is due far enough ahead (PACKS: none)
-- ARGV[1] the schedule's name
-- ARGV[2] the revision of the runtime schedules' definitions the occurrence was built from, or '' for a schedule
--         that does not depend on them: a changed revision (a schedule added, changed, paused ...) refuses the
--         occurrence, and the scheduler reads the definitions again and offers anew
-- ARGV[3] min_ahead_ms: an occurrence due at least this far ahead is packed when given a pack; -1 never
-- ARGV[4] id  ARGV[5] due time ('@' and epoch ms, or ms from Redis TIME)  ARGV[6] envelope
-- ARGV[7] .. ARGV[10]: the packed index's shape, the id's 16-byte form, its packed location and the key map
--         (see by_id_trailer and id_keys)
-- Returns {due_ms, outcome, woke, over, fullest, damaged} as park.lua does for one message; outcome 0 (kept)
-- gives the due time of the latest occurrence parked for the schedule, 3 means refused: the revision changed.
-- No max_delay: an occurrence is parked a period ahead, which the application chose with the schedule.

local k = {due = DUE, msg = MSG, inflight = INFLIGHT, leased = LEASED, dead = DEAD, attempts = ATTEMPTS,
    errors = ERRORS, wake = WAKE, stats = STATS, packs = PACKS, pack_base = PACK_BASE, pack_live = PACK_LIVE}
local schedule = ARGV[1]
local keys = id_keys(1, 3)
local shape, binaries, locations = by_id_trailer()
local now = now_ms()
local messages, refusal = park_messages(4, 1, now, -1, keys, binaries)
if not messages then
    return refusal
end
local problem = wrong_type(CRON, 'hash', SCHEDULES_REV, 'string', MSG, 'hash', DUE, 'zset', INFLIGHT, 'zset',
    DEAD, 'zset', PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash') or id_keys_wrong_type(keys)
if problem then
    return problem
end
local places, stale
places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if problem then
    return problem
end
local skip = {}
local damaged_packs, head = plan_park(k, messages, places, false, skip, now, tonumber(ARGV[3]))

if ARGV[2] ~= '' and (redis.call('GET', SCHEDULES_REV) or '0') ~= ARGV[2] then
    return {-1, 3, 0, -1, 0, ''}
end
local latest = redis.call('HGET', CRON, schedule)
if latest then
    -- Digits only, as Python reads records: tonumber would also take '1e400', '0x10', '1.5' or 'nan', and the
    -- two would disagree on what the latest occurrence is.
    local latest_due = string.match(latest, '^%d+$') and tonumber(latest)
    if not latest_due then
        return redis.error_reply('ERR malformed record of schedule ' .. schedule .. ' in ' .. CRON .. ': '
            .. string.sub(latest, 1, 40) .. ' (delete the field to start it afresh)')
    end
    if messages[1].due <= latest_due then
        return {latest_due, 0, 0, -1, 0, ''}
    end
end

local writing, wakes = check_park(k, messages, false, skip, head, 'parked')
if not writing then
    return wakes
end
redis.call('HSET', CRON, schedule, messages[1].due)
local result, delivered, filled, earlier_packs = write_park(k, messages, false, skip, stale)
return finish_park(k, result, delivered, filled, earlier_packs, wakes, damaged_packs)
