-- parking.lua: what park.lua, park_occurrence.lua and adopt.lua share: reading the messages of a park, telling
-- which ids the store holds, deciding what to write (checked before anything is written), then writing each
-- message into its pack or the ordinary layout in place of what the store held of its id.
-- KEYS: none of its own: the functions take `k`, the calling script's shard keys by name ({due = DUE, ...}).
-- ARGV: none of its own; park_messages reads the groups it is told where to find.

-- The messages of a park: `count` groups of three ARGV from `first` on (id, due time as due_at takes it,
-- envelope), each with its id_keys and 16-byte id, its due time checked against `max_delay` (ms, -1: none); or
-- nil and the refusal.
local function park_messages(first, count, now, max_delay, keys, binaries)
    local messages = {}
    for n = 1, count do
        local at = first + (n - 1) * 3
        local id = ARGV[at]
        local due = due_at(ARGV[at + 1], now)
        local refusal = due_refusal(id, due, now, max_delay)
        if refusal then
            return nil, refusal
        end
        messages[n] = {id = id, due = due, envelope = ARGV[at + 2], keys = keys[n], binary = binary_at(binaries, n)}
    end
    return messages
end

-- Reads what a park needs before it writes (park.lua runs it under pcall: a read of a key of the wrong type
-- fails, and nothing was written). Sets per message `place` (where it is packed), `held` (what the store holds
-- of its id: held_due, or what an earlier message of the call leaves: an id given twice meets the first one's
-- outcome, as if parked by two calls in order) and `target` (the pack it goes to: due at least `min_ahead` ms
-- from now, -1 never, given a pack, its id given once). `skip[n]`: the message is not parked at all. Returns
-- the names of the packs not used because their bookkeeping is damaged (their messages take the ordinary
-- layout) and the head of DUE.
local function plan_park(k, messages, places, replace, skip, now, min_ahead)
    local earlier, times, targets, damaged_packs = {}, {}, {}, {}
    for _, message in ipairs(messages) do
        times[message.id] = (times[message.id] or 0) + 1
    end
    for n, message in ipairs(messages) do
        local id = message.id
        message.place = places[n]
        message.held = earlier[id] or held_due(id, places[n], k.msg, k.due, k.inflight, k.dead)
        if not skip[n] then
            earlier[id] = (message.held and not replace) and message.held or message.due
        end
        local key = message.keys.target
        local name = key ~= k.packs and min_ahead >= 0 and times[id] == 1 and message.due - now >= min_ahead
            and string.match(key, ':pack:(%d+:%d+)$')
        if name then
            if targets[name] == nil then
                redis.call('LLEN', key)  -- its type, before anything is written
                targets[name] = pack_target(k.packs, k.pack_base, k.pack_live, key, name) or false
                if not targets[name] then
                    damaged_packs[#damaged_packs + 1] = name
                end
            end
            message.target = targets[name] or nil
        end
    end
    return damaged_packs, head_due(k.due)
end

-- What a planned park will write, and the checks of the keys it only writes, before it writes: returns how
-- many messages it writes, whether it wakes a promoter (a message into the ordinary layout due before `head`),
-- or nil and the refusal. `fresh_counter`: the counter of messages new to Redis ('parked', or 'moved_in' for far
-- rows adopted, which were counted when parked).
local function check_park(k, messages, replace, skip, head, fresh_counter)
    local writing, renewing, replacing, earliest = 0, 0, false, false
    for n, message in ipairs(messages) do
        if not skip[n] and (not message.held or replace) then
            writing = writing + 1
            -- A message still parked that is parked again (a debounce, or a producer's retry of a park whose
            -- reply it lost) is counted as replaced: 'parked' counts messages that came in, each once, to be
            -- matched against what went out. One in flight or dead came back in: parked.
            if message.place or (message.held and message.held >= 0) then
                renewing = renewing + 1
            end
            replacing = replacing or (message.held and not message.place)
            if not message.target and (not earliest or message.due < earliest) then
                earliest = message.due
            end
        end
    end
    local wakes = earliest and (not head or earliest < head) or false
    local fresh = fresh_counter == 'moved_in' and writing or writing - renewing
    if writing == 0 then
        return 0, false
    end
    -- MSG and DUE were read, which checked their types; STATS by its first write, which comes before any
    -- other: a refusal there leaves every message as it was.
    local problem = (wakes and wrong_type(k.wake, 'list'))
        or (replacing and wrong_type(k.leased, 'hash', k.attempts, 'hash', k.errors, 'hash'))
        or (fresh > 0 and count_first(k.stats, fresh_counter, fresh))
        or (fresh < writing and count_first(k.stats, 'replaced', writing - fresh))
    if problem then
        return nil, problem
    end
    return writing, wakes
end

-- Writes the messages of a planned park, each into its pack or the ordinary layout in place of what the store
-- held of its id; a message kept (held, and not `replace`) or skipped is left; first the index entries
-- pack_locate found `stale`. Returns the reply's two entries per message (due time, outcome: 1 new, 2 replaced,
-- 0 kept with its current due time, -1 in flight or dead; 4 skipped), how many in-flight copies it replaced
-- (their delivery is done or under way: promoted), the partitions now past SPLIT_AT, and the packs whose
-- earliest due time went down.
local function write_park(k, messages, replace, skip, stale)
    drop_stale(stale, k.stats)
    local result, taken, filled, earlier_packs = {}, {}, {}, {}
    local delivered = 0
    for n, message in ipairs(messages) do
        local id, place, target = message.id, message.place, message.target
        if skip[n] then
            result[2 * n - 1], result[2 * n] = -1, 4
        elseif message.held and not replace then
            result[2 * n - 1], result[2 * n] = message.held, 0
        else
            if place and not taken[id] then
                taken[id] = true
                pack_take(place, k.packs, k.pack_base, k.pack_live)
            elseif message.held and not place then
                -- Parked again while a promoter holds it: its delivery is under way or done (a Dramatiq retry
                -- re-parks the same id), and that promoter's ack will find no lease to count. Counted here.
                delivered = delivered + redis.call('ZREM', k.inflight, id)
                redis.call('HDEL', k.leased, id)
                redis.call('ZREM', k.dead, id)
                redis.call('HDEL', k.attempts, id)
                redis.call('HDEL', k.errors, id)
                if target then
                    redis.call('ZREM', k.due, id)
                    redis.call('HDEL', k.msg, id)
                end
            end
            if target then
                local partition = message.keys.partition
                local _, earlier = pack_append(target, partition, message.binary, message.due, message.envelope,
                    k.packs, k.pack_live)
                filled[partition] = true
                earlier_packs[target.name] = earlier or earlier_packs[target.name]
            else
                redis.call('ZADD', k.due, fifo_score(k.due, message.due), id)
                redis.call('HSET', k.msg, id, message.envelope)
            end
            result[2 * n - 1], result[2 * n] = message.due, message.held and 2 or 1
        end
    end
    return result, delivered, filled, earlier_packs
end

-- The end of a park's reply, after its writes: counts what it promoted and the damaged packs it did not use,
-- wakes a promoter (`wakes`, or for a pack now the first to open), and appends to `result` 1 if it woke one else
-- 0, the highest index partition it filled past SPLIT_AT and the entries of the fullest (-1 and 0 for none: the
-- caller splits the index), and those damaged packs, space-separated.
local function finish_park(k, result, delivered, filled, earlier_packs, wakes, damaged_packs)
    count_damage(k.stats, #damaged_packs)
    if delivered > 0 then
        redis.call('HINCRBY', k.stats, 'promoted', delivered)
    end
    local woke = 0
    if wakes then
        wake_one(k.wake)
        woke = 1
    elseif next(earlier_packs) and wake_for_pack(k.packs, earlier_packs, k.wake) then
        woke = 1
    end
    local over, fullest = -1, 0
    for key in pairs(filled) do
        local size = redis.call('HLEN', key)
        if size > SPLIT_AT then
            over = math.max(over, tonumber(string.match(key, ':packed:(%d+)$')))
            fullest = math.max(fullest, size)
        end
    end
    result[#result + 1] = woke
    result[#result + 1] = over
    result[#result + 1] = fullest
    result[#result + 1] = table.concat(damaged_packs, ' ')
    return result
end
