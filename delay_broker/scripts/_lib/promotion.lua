-- promotion.lua: what promoting shares: taking due messages, dead letters, leases, heartbeats, lateness, and
-- waking a sleeping promoter.
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none.

-- Takes the `count` earliest members; returns their ids and the ZPOPMIN reply {id, score, id, score, ...}.
local function pop_due(due_key, count)
    local popped = redis.call('ZPOPMIN', due_key, count)
    local ids = {}
    for i = 1, #popped, 2 do
        ids[#ids + 1] = popped[i]
    end
    return ids, popped
end

local function dead_letter(dead_key, errors_key, stats_key, id, reason, now)
    redis.call('ZADD', dead_key, now, id)
    redis.call('HSET', errors_key, id, reason)
    redis.call('HINCRBY', stats_key, 'dead_lettered', 1)
end

-- Wake one sleeping promoter. The token is the wake list's own name, which tells a promoter of a sharded
-- namespace which shard to look at (tokens of other shards are relayed to shard 0's list by the store); one
-- token per shard is enough: whoever takes it re-reads that shard's head for everyone.
local function wake_one(wake_key)
    redis.call('LREM', wake_key, 0, wake_key)
    redis.call('LPUSH', wake_key, wake_key)
end

-- What a leased message goes back with: its due score (from LEASED; now if that is gone) and its failed
-- attempts so far; or nil, nil and the reason to dead-letter it when either is not a number, since giving it
-- back would fail half-way or loop. Reads only.
local function lease_record(leased_key, attempts_key, id, now)
    local leased = redis.call('HGET', leased_key, id)
    local score = now * FIFO_SLOTS
    if leased then
        score = tonumber(leased)
    end
    -- tonumber takes 'nan' and 'inf' too: ZADD refuses NaN, which failed the script after its deletes.
    if not score or score ~= score or score == math.huge or score == -math.huge then
        return nil, nil, 'malformed lease record: its due score is not a number'
    end
    local counted = redis.call('HGET', attempts_key, id)
    local attempts = 0
    if counted then
        attempts = tonumber(counted)
    end
    if not attempts or attempts < 0 or attempts ~= math.floor(attempts) then
        return nil, nil, 'malformed attempts count: not a whole number'
    end
    return score, attempts, nil
end

-- A promoter's heartbeat, written after the script's other writes. Over maxmemory Redis refuses a script's
-- first write if it may grow memory (ZADD): a promoter that pops and deletes first is what lets the store
-- drain, and one with nothing to do skips its heartbeat rather than fail. Any other refusal (a read-only
-- replica, too few replicas) is returned, for the script to return: it stops the first write as well, so
-- nothing was written before it.
local function heartbeat(promoters_key, now, promoter)
    local reply = redis.pcall('ZADD', promoters_key, now, promoter)
    if type(reply) == 'table' and reply['err'] and not string.find(reply['err'], 'OOM', 1, true) then
        return reply
    end
    return nil
end

-- Promotion lateness, store-wide and all time: how many messages were promoted how late (ms after their due
-- time), in buckets named by their upper edge ('10' = under 10 ms, ..., 'more'). Must equal
-- delay_broker.store.LATENESS_EDGES_MS.
local LATENESS_EDGES = {10, 100, 1000, 10000, 60000}

-- Adds lateness `counts` (by bucket position, the last for 'more') to LATENESS: named once per bucket, not per
-- message (a name per message made a string per message).
local function add_lateness(lateness_key, counts)
    for bucket, count in pairs(counts) do
        if count > 0 then
            local name = bucket > #LATENESS_EDGES and 'more' or tostring(LATENESS_EDGES[bucket])
            redis.call('HINCRBY', lateness_key, name, count)
        end
    end
end

-- The bucket position of a lateness value (ms).
local function lateness_bucket(value)
    for position, edge in ipairs(LATENESS_EDGES) do
        if value < edge then
            return position
        end
    end
    return #LATENESS_EDGES + 1
end

local function count_lateness(lateness_key, values)
    local counts = {}
    for _, value in ipairs(values) do
        local bucket = lateness_bucket(value)
        counts[bucket] = (counts[bucket] or 0) + 1
    end
    add_lateness(lateness_key, counts)
end

-- How many of the `ready` earliest messages of a due ZSET (those a promotion takes) are how late at `now`, by
-- bucket position: one ZCOUNT per edge instead of a look at each message's score (taken messages at least
-- `edge` late are those due by now - edge, the earliest of them).
local function lateness_counts(due_key, now, ready)
    local counts, previous = {}, ready
    for position, edge in ipairs(LATENESS_EDGES) do
        local late = math.min(ready, redis.call('ZCOUNT', due_key, '-inf', due_limit(now - edge)))
        counts[position] = previous - late
        previous = late
    end
    counts[#LATENESS_EDGES + 1] = previous
    return counts
end
