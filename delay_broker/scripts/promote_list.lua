-- promote_list.lua: exactly-once promotion of due messages straight into Redis lists of the same server.
-- Claiming and pushing happen in one atomic step, so a crash can neither lose nor duplicate a message.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
--   PROMOTERS ZSET promoter id -> last heartbeat
--   LATENESS  HASH lateness bucket -> messages promoted that late
-- KEYS[FIRST_EXTRA_KEY + 2k], KEYS[FIRST_EXTRA_KEY + 2k + 1]  list key and payload-hash key of route k (k from
--   0); a route without a hash repeats its list key in the second slot. They must be in the shard's slot.
-- ARGV[1] batch (<= 1000)   ARGV[2] promoter id
-- ARGV[3] '1': return each promoted message's lateness (for a promoter's listener); '' counts them by bucket
--         alone (LATENESS), without reading a score per message
-- ARGV[4] ahead: ms before its due time a message is promoted ('0': when due), for consumers that hold a message
--         until its own due time (Celery's eta); lateness is counted against that time
-- ARGV[5..] groups of 2 per route k, in KEYS order: route name, mode
--   mode 'lpush': LPUSH the payload (consumers BRPOP, e.g. Celery's Redis transport, a plain ready list)
--   mode 'rpush': RPUSH the payload (consumers LPOP)
--   mode 'hash':  HSET hash <field> payload, then RPUSH list <field>, where <field> is the envelope header's
--                 'h' (Dramatiq's RedisBroker: <ns>:<queue>.msgs and <ns>:<queue>)
-- Returns {now_ms, next_due_ms (when the next message is to be promoted: its due time less ahead; -1: nothing
-- parked), promoted, dead_lettered, groups, then per group: route,
-- name (the envelope's 'n', '' without one), count; then traced, and per traced message: id, route, traceparent,
-- tracestate ('' without one); then lateness_ms of each message promoted, when asked for}. The groups feed
-- metrics per queue and task name; the traced messages (an OpenTelemetry context in the header's x.otel) get a
-- promote span.
-- An envelope with no route among these goes to the dead letters: a stored message can reach only the
-- queues the application declared.

local problem = denied_command()
    or wrong_type(DUE, 'zset', PROMOTERS, 'zset')
if problem then
    return problem
end
local REMOVE_BY_RANK = 'ZREMRANGEBYRANK'  -- optional: see where the taken ids are removed
local batch = tonumber(ARGV[1])
local want_lateness = ARGV[3] == '1'
local now = now_ms()
local ahead = tonumber(ARGV[4])
local horizon = now + ahead  -- what is due by then is promoted now

local routes = {}
for k = 0, (#ARGV - 4) / 2 - 1 do
    local list, hash = KEYS[FIRST_EXTRA_KEY + 2 * k], KEYS[FIRST_EXTRA_KEY + 2 * k + 1]
    routes[ARGV[5 + 2 * k]] = {list = list, hash = hash, mode = ARGV[6 + 2 * k]}
end

local promoted, dead = 0, 0
local result = {now, -1, 0, 0}
local lateness = {}
local counted, by_task = {}, {}
local traced = {}
local ready = count_due(DUE, horizon, batch)
if ready > 0 then
    -- Every key written below must hold the right type before the first write (see wrong_type).
    local spec = {MSG, 'hash', DEAD, 'zset', ATTEMPTS, 'hash', ERRORS, 'hash', STATS, 'hash', LATENESS, 'hash'}
    for _, route in pairs(routes) do
        spec[#spec + 1] = route.list
        spec[#spec + 1] = 'list'
        if route.mode == 'hash' then
            spec[#spec + 1] = route.hash
            spec[#spec + 1] = 'hash'
        end
    end
    local problem = wrong_type(unpack(spec))
    if problem then
        return problem
    end
    -- Reads first, then the first write is a delete (over maxmemory Redis refuses a script's first write only if
    -- it may grow memory): nothing below fails half-way.
    local limit = due_limit(horizon)
    local ids, scores, counts
    if want_lateness then
        local taken = redis.call('ZRANGE', DUE, '-inf', limit, 'BYSCORE', 'LIMIT', 0, ready, 'WITHSCORES')
        ids, scores = {}, {}
        for i = 1, #taken, 2 do
            ids[#ids + 1], scores[#scores + 1] = taken[i], taken[i + 1]
        end
    else
        ids = redis.call('ZRANGE', DUE, '-inf', limit, 'BYSCORE', 'LIMIT', 0, ready)
        counts = lateness_counts(DUE, horizon, ready)
    end
    local envelopes = redis.call('HMGET', MSG, unpack(ids))

    -- Pushes are grouped per route, in due order, so each batch costs one push per route.
    local pushes, order, failed = {}, {}, {}
    local function fail(id, envelope, reason)
        failed[#failed + 1] = {id, envelope, reason}
        if counts then  -- counted late above as if promoted: it is not
            local bucket = lateness_bucket(horizon - due_of(redis.call('ZSCORE', DUE, id)))
            counts[bucket] = counts[bucket] - 1
        end
    end
    for n, id in ipairs(ids) do
        local envelope = envelopes[n]
        if not envelope then
            fail(id, nil, 'missing payload: no envelope stored for this id')
        else
            local header, payload, problem = open_envelope(envelope)
            local route = header and routes[header.r]
            local name = header and type(header.n) == 'string' and header.n or ''
            -- Looked up route then name, not by a joined key: a key string per message costs a batch.
            local of_route = route and counted[header.r]
            local group_index = of_route and of_route[name]
            if problem then
                fail(id, envelope, problem)
            elseif not route then
                fail(id, envelope, 'unknown route ' .. cjson.encode(header.r) .. ': not declared by the application')
            elseif route.mode == 'hash' and type(header.h) ~= 'string' then
                fail(id, envelope, 'malformed envelope: no hash field for route ' .. header.r)
            elseif not group_index and not is_utf8(name) then
                -- Checked once per name of a batch, not per message: names repeat, and the check is not free.
                fail(id, envelope, 'malformed envelope: name is not UTF-8')
            else
                local group = pushes[header.r]
                if not group then
                    group = {route = route, items = {}, fields = {}}
                    pushes[header.r] = group
                    order[#order + 1] = header.r
                end
                local items = group.items
                if route.mode == 'hash' then
                    local fields = group.fields
                    fields[#fields + 1] = header.h
                    items[#items + 1] = header.h
                    items[#items + 1] = payload
                else
                    items[#items + 1] = payload
                end
                promoted = promoted + 1
                if scores then
                    lateness[promoted] = horizon - due_of(scores[n])
                end
                if not of_route then
                    of_route = {}
                    counted[header.r] = of_route
                end
                if not group_index then
                    by_task[#by_task + 1] = {header.r, name, 0}
                    group_index = #by_task
                    of_route[name] = group_index
                end
                by_task[group_index][3] = by_task[group_index][3] + 1
                local carrier = type(header.x) == 'table' and header.x.otel
                if type(carrier) == 'table' and type(carrier.traceparent) == 'string' then
                    traced[#traced + 1] = {id, header.r, carrier.traceparent,
                        type(carrier.tracestate) == 'string' and carrier.tracestate or ''}
                end
            end
        end
    end

    -- The ids are DUE's first by rank (taken from -inf): removed by rank, without a look-up of each member, when
    -- the user may (checked, so not in SCRIPT_COMMANDS: ACL lines from before it was used lack it; Redis 6.2
    -- cannot check, and ZREMs).
    if redis.acl_check_cmd and redis.acl_check_cmd(REMOVE_BY_RANK) then
        redis.call(REMOVE_BY_RANK, DUE, 0, #ids - 1)
    else
        redis.call('ZREM', DUE, unpack(ids))
    end
    redis.call('HDEL', MSG, unpack(ids))
    -- Attempts and errors exist only for messages that failed before: skip the work when there are none.
    if redis.call('EXISTS', ATTEMPTS) == 1 then
        redis.call('HDEL', ATTEMPTS, unpack(ids))
    end
    if redis.call('EXISTS', ERRORS) == 1 then
        redis.call('HDEL', ERRORS, unpack(ids))
    end
    for _, failure in ipairs(failed) do
        dead_letter(DEAD, ERRORS, STATS, failure[1], failure[3], now)
        if failure[2] then
            redis.call('HSET', MSG, failure[1], failure[2])
        end
    end
    dead = #failed
    for _, name in ipairs(order) do
        local group = pushes[name]
        local route = group.route
        if route.mode == 'hash' then
            redis.call('HSET', route.hash, unpack(group.items))
            redis.call('RPUSH', route.list, unpack(group.fields))
        elseif route.mode == 'rpush' then
            redis.call('RPUSH', route.list, unpack(group.items))
        else
            redis.call('LPUSH', route.list, unpack(group.items))
        end
    end
    if promoted > 0 then
        redis.call('HINCRBY', STATS, 'promoted', promoted)
        if counts then
            add_lateness(LATENESS, counts)
        else
            count_lateness(LATENESS, lateness)
        end
    end
end

local next_due = head_due(DUE)
if next_due then
    result[2] = next_due - ahead
end
local refused = heartbeat(PROMOTERS, now, ARGV[2])
if refused then
    return refused
end
result[3] = promoted
result[4] = dead
result[5] = #by_task
for _, group in ipairs(by_task) do
    result[#result + 1] = group[1]
    result[#result + 1] = group[2]
    result[#result + 1] = group[3]
end
result[#result + 1] = #traced
for _, entry in ipairs(traced) do
    for _, value in ipairs(entry) do
        result[#result + 1] = value
    end
end
for _, value in ipairs(lateness) do
    result[#result + 1] = value
end
return result
