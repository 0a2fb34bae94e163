-- park.lua: park one or more messages (ZADD due + HSET msg, or a record appended to a pack), all or nothing.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   LEASED    HASH id -> due score while in flight
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   WAKE      LIST wake marker
--   STATS     HASH counters ('parked', 'replaced'; 'moved_in' when adopting far rows)
--   CRON      HASH schedule name -> due ms of the latest occurrence parked for it (decimal digits only; any
--             other value is a malformed record, refused)
--   SCHEDULES_REV  STRING revision of the runtime schedules' definitions
--   MOVED     ZSET far-tier token -> when its message was moved in (adopting, or replacing far rows)
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape (see pack_locate)
-- KEYS after the shard's, three per message: its packed index partition, the pack the caller says it is packed
--   in (see pack_locate), and the pack to append it to if it is due far enough ahead (PACKS when none).
-- ARGV[1] on_conflict: 'replace' (reschedule and replace the payload) or 'keep' (leave an existing id alone)
-- ARGV[2] max_due_ms: latest due time accepted
-- ARGV[3] schedule: '' or the name of a recurring schedule. With a name the call parks one occurrence, and
--         only when it is due later than the latest one parked for that schedule, ever: any number of
--         schedulers may offer the same occurrence, before or after it was promoted, and it runs once.
-- ARGV[4] max_delay_ms: latest due time accepted, counted from Redis TIME (the store's max_delay), or -1 for
--         none. Checked here, where the due time is computed, so it costs no extra round trip.
-- ARGV[5] schedules revision: with a schedule, the revision of the definitions the occurrence was built from,
--         or '' for a schedule that does not depend on them. A changed revision (a schedule added, changed,
--         paused ...) refuses the occurrence: the scheduler reads the definitions again and offers anew.
-- ARGV[6] adopting from the far tier: '' for an ordinary park, else the mover's deadline (Redis TIME, ms): past
--         it the mover's PostgreSQL locks may be gone and another mover may hold the rows, so nothing is written
-- ARGV[7] adopting: the far-tier tokens of the groups, space-separated, in group order. A token already in
--         MOVED was adopted before, by a mover that died before deleting its row: that group is skipped. Every
--         token is recorded (again), so that a row moved in is never moved in twice (nor run twice).
--         Not adopting: '' or the tokens of the far rows this park replaces, whose delete commits only after
--         it; they are recorded in MOVED, so that a row whose delete failed is never moved in after all.
-- ARGV[8] pack_after: ms; a message due at least half this from now is packed when given a pack, -1 never
-- ARGV[9..] groups of 4: id, kind ('d' = delay in ms from Redis TIME, 'a' = absolute due ms), value, envelope
-- ARGV[#ARGV - 2] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms and their packed locations
--         (see pack_locate)
-- Returns a flat list, two entries per message: due_ms, outcome (1 = new, 2 = replaced, 0 = kept existing;
-- for a kept message due_ms is its current due time, or -1 when it is in flight or dead; for a refused
-- occurrence, the due time of the latest occurrence parked for its schedule; outcome 3 = refused, the schedules
-- revision changed; outcome 4 = skipped, moved in before); then 1 if WAKE was pushed, else 0; then the
-- highest index partition this call filled past SPLIT_AT and the entries of the fullest, or -1 and 0 (the
-- caller splits the index as they say). Or a refusal of pack_locate, having written nothing.

local FIRST_GROUP = 9
local LAST_GROUP = #ARGV - 3
local pack_after = tonumber(ARGV[8])
local replace = ARGV[1] == 'replace'
local max_due = tonumber(ARGV[2])
local schedule = ARGV[3]
local max_delay = tonumber(ARGV[4])
local adopting = ARGV[6] ~= ''
local retiring = not adopting and ARGV[7] ~= ''
local now = now_ms()
if adopting and now >= tonumber(ARGV[6]) then
    return redis.error_reply('LEASEGONE far-tier move refused: its lease ran out (another mover may own the rows)')
end

-- Validate everything before writing anything: a script error does not roll back earlier writes.
local dues = {}
local count = 0
for i = FIRST_GROUP, LAST_GROUP, 4 do
    local value = tonumber(ARGV[i + 2])
    local due = value
    if ARGV[i + 1] == 'd' then
        due = now + value
    end
    if due > max_due then
        return redis.error_reply('ERR delay_broker: due time of ' .. ARGV[i] .. ' is past the latest supported')
    end
    if max_delay >= 0 and due - now > max_delay then
        return too_far(ARGV[i], due - now, max_delay)
    end
    count = count + 1
    dues[count] = due
end

-- Reads first, writes after, so that a key of the wrong type stops the script before it changes anything. The
-- reads check the types of the keys they touch for free; only when one fails are all keys examined, to name
-- the culprit. The keys that are only written get a TYPE check each, and only when they are about to be.
local held, head, tokens, moved, places, stale, packing
local read_ok, read_error = pcall(function()
    held = {}
    moved = {}
    if adopting then
        tokens = {}
        for token in string.gmatch(ARGV[7], '%S+') do
            tokens[#tokens + 1] = token
            moved[#tokens] = redis.call('ZSCORE', MOVED, token) ~= false
        end
    end
    local problem
    places, stale, problem = pack_locate(count, FIRST_EXTRA_KEY, 3, ARGV[#ARGV - 2], ARGV[#ARGV - 1], ARGV[#ARGV],
        PACK_BASE, PACKED_SHAPE)
    if problem then
        error(problem)
    end
    -- An id given twice meets the first group's outcome, as if parked by two calls in order; it is not packed.
    local earlier, times, targets = {}, {}, {}
    packing = {}
    for n = 1, count do
        local id = ARGV[FIRST_GROUP + (n - 1) * 4]
        times[id] = (times[id] or 0) + 1
    end
    for n = 1, count do
        local id = ARGV[FIRST_GROUP + (n - 1) * 4]
        -- A new id costs two lookups: every parked, leased or dead message has its envelope in MSG, except a
        -- dead letter whose envelope had gone missing; a packed one has its entry in the packed index.
        if earlier[id] then
            held[n] = earlier[id]
        elseif places[n] then
            held[n] = packed_due(places[n][4]) or -1
        elseif redis.call('HEXISTS', MSG, id) == 1 then
            local existing = redis.call('ZSCORE', DUE, id)
            if existing then
                held[n] = due_of(existing)
            elseif redis.call('ZSCORE', INFLIGHT, id) or redis.call('ZSCORE', DEAD, id) then
                held[n] = -1
            end
        elseif redis.call('ZSCORE', DEAD, id) then
            held[n] = -1
        end
        if not moved[n] then
            earlier[id] = (held[n] and not replace) and held[n] or dues[n]
        end
        local target = KEYS[FIRST_EXTRA_KEY + (n - 1) * 3 + 2]
        if pack_after >= 0 and target ~= PACKS and times[id] == 1 and dues[n] - now >= pack_after / 2 then
            local name = string.match(target, ':pack:(%d+:%d+)$')
            if name then
                packing[n] = name
                if not targets[name] then
                    targets[name] = true
                    redis.call('LLEN', target)  -- its type, before anything is written
                end
            end
        end
    end
    if next(targets) then
        redis.call('ZCARD', PACKS)
        redis.call('HLEN', PACK_LIVE)
        redis.call('HLEN', PACK_BASE)
    end
    head = head_due(DUE)
end)
if not read_ok then
    -- A refusal of pack_locate as it made it; else a key of the wrong type, named; else the refusal as raised.
    local refusal = type(read_error) == 'table' and read_error.err
    if refusal and (string.find(refusal, '^PACKED ') or string.find(refusal, '^RESHAPED ')) then
        return read_error
    end
    return wrong_type(MSG, 'hash', DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', MOVED, 'zset', PACKS, 'zset',
        PACK_BASE, 'hash', PACK_LIVE, 'hash')
        or packed_keys_wrong_type(count, FIRST_EXTRA_KEY, 3)
        or redis.error_reply(type(read_error) == 'table' and tostring(read_error.err) or tostring(read_error))
end

-- Only scheduled parks read the cron record: a stray key there must not stop ordinary sends.
if schedule ~= '' then
    local problem = wrong_type(CRON, 'hash', SCHEDULES_REV, 'string')
    if problem then
        return problem
    end
    if count ~= 1 then
        return redis.error_reply('ERR a scheduled occurrence is parked on its own')
    end
    if ARGV[5] ~= '' and (redis.call('GET', SCHEDULES_REV) or '0') ~= ARGV[5] then
        return {-1, 3, 0, -1, 0}
    end
    local latest = redis.call('HGET', CRON, schedule)
    if latest then
        -- Digits only, as Python reads records: tonumber would also take '1e400', '0x10', '1.5' or 'nan', and
        -- the two would disagree on what the latest occurrence is.
        local latest_due = string.match(latest, '^%d+$') and tonumber(latest)
        if not latest_due then
            return redis.error_reply('ERR malformed record of schedule ' .. schedule .. ' in '
                .. CRON .. ': ' .. string.sub(latest, 1, 40) .. ' (delete the field to start it afresh)')
        end
        if dues[1] <= latest_due then
            return {latest_due, 0, 0, -1, 0}
        end
    end
end

-- What will be written, decided before writing: the keys it writes are checked first.
local writing, renewing, replacing, earliest = 0, 0, false, false
for n = 1, count do
    if not moved[n] and (not held[n] or replace) then
        writing = writing + 1
        -- A message still parked that is parked again (a debounce, or a producer's retry of a park whose reply
        -- it lost) is counted as replaced: 'parked' counts messages that came in, each once, to be matched
        -- against what went out (promoted, cancelled ...). One in flight or dead came back in: parked.
        if places[n] or (held[n] and held[n] >= 0) then
            renewing = renewing + 1
        end
        replacing = replacing or (held[n] ~= nil and not places[n])
        if not packing[n] and (not earliest or dues[n] < earliest) then
            earliest = dues[n]
        end
    end
end
local woke = (earliest and (not head or earliest < head)) and 1 or 0
local fresh = adopting and writing or writing - renewing
if writing > 0 then
    -- MSG and DUE were read above, which checked their types. The keys only written are checked here, the
    -- rare ones with TYPE; STATS by its first write, which comes before any other: a refusal there leaves
    -- every message as it was.
    local problem = (woke == 1 and wrong_type(WAKE, 'list'))
        or (retiring and wrong_type(MOVED, 'zset'))
        or (replacing and wrong_type(LEASED, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash'))
        -- A far row was counted as parked when it was parked: moving it in is counted apart.
        or (fresh > 0 and count_first(STATS, adopting and 'moved_in' or 'parked', fresh))
        or (fresh < writing and count_first(STATS, 'replaced', writing - fresh))
    if problem then
        return problem
    end
end

drop_stale(stale)
if schedule ~= '' then
    redis.call('HSET', CRON, schedule, dues[1])
end
local result = {}
local delivered = 0
local taken = {}
local filled = {}
local earlier_packs = {}
for n = 1, count do
    local i = FIRST_GROUP + (n - 1) * 4
    local id = ARGV[i]
    if moved[n] then
        result[#result + 1] = -1
        result[#result + 1] = 4
    elseif held[n] and not replace then
        result[#result + 1] = held[n]
        result[#result + 1] = 0
    else
        if places[n] and not taken[id] then
            taken[id] = true
            pack_take(places[n], PACKS, PACK_BASE, PACK_LIVE)
        elseif held[n] and not places[n] then
            -- Parked again while a promoter holds it: its delivery is under way or done (a Dramatiq retry
            -- re-parks the same id), and that promoter's ack will find no lease to count. Count it here.
            delivered = delivered + redis.call('ZREM', INFLIGHT, id)
            redis.call('HDEL', LEASED, id)
            redis.call('ZREM', DEAD, id)
            redis.call('HDEL', ATTEMPTS, id)
            redis.call('HDEL', ERRORS, id)
            if packing[n] then
                redis.call('ZREM', DUE, id)
                redis.call('HDEL', MSG, id)
            end
        end
        local name = packing[n]
        if name then
            local partition = KEYS[FIRST_EXTRA_KEY + (n - 1) * 3]
            local over, earlier = pack_append(partition, KEYS[FIRST_EXTRA_KEY + (n - 1) * 3 + 2], name,
                string.sub(ARGV[#ARGV - 1], n * 16 - 15, n * 16), dues[n], ARGV[i + 3], PACKS, PACK_BASE, PACK_LIVE)
            if over then
                filled[partition] = true
            end
            if earlier then
                earlier_packs[name] = true
            end
        else
            redis.call('ZADD', DUE, fifo_score(DUE, dues[n]), id)
            redis.call('HSET', MSG, id, ARGV[i + 3])
        end
        result[#result + 1] = dues[n]
        result[#result + 1] = held[n] and 2 or 1
    end
end

if adopting then
    -- A group moved in before is recorded again too: then this call writes, and the WAIT that follows it (the
    -- row is deleted only once a replica confirms) covers the earlier move, which may not have been confirmed.
    for n = 1, count do
        redis.call('ZADD', MOVED, now, tokens[n])
    end
end
if retiring then
    for token in string.gmatch(ARGV[7], '%S+') do
        redis.call('ZADD', MOVED, now, token)
    end
end
if delivered > 0 then
    redis.call('HINCRBY', STATS, 'promoted', delivered)
end
if woke == 1 then
    wake_one(WAKE)
elseif next(earlier_packs) and wake_for_pack(PACKS, earlier_packs, WAKE) then
    woke = 1
end
result[#result + 1] = woke
local over, fullest = -1, 0
for key in pairs(filled) do
    over = math.max(over, tonumber(string.match(key, ':packed:(%d+)$')))
    fullest = math.max(fullest, redis.call('HLEN', key))
end
result[#result + 1] = over
result[#result + 1] = fullest
return result
