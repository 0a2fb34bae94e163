-- promote_list.lua: exactly-once promotion of due messages straight into Redis lists of the same server.
-- Claiming and pushing happen in one atomic step, so a crash can neither lose nor duplicate a message.
-- KEYS[1] due        ZSET id -> score
-- KEYS[2] msg        HASH id -> envelope
-- KEYS[3] dead       ZSET id -> dead-lettered at
-- KEYS[4] attempts   HASH id -> failed attempts
-- KEYS[5] errors     HASH id -> last error
-- KEYS[6] stats      HASH counters
-- KEYS[7] promoters  ZSET promoter id -> last heartbeat
-- KEYS[8 + 2k], KEYS[9 + 2k]  list key and payload-hash key of route k (k from 0); a route without a hash
--                             repeats its list key in the second slot
-- ARGV[1] batch (<= 1000)   ARGV[2] promoter id
-- ARGV[3..] groups of 2 per route k, in KEYS order: route name, mode
--   mode 'lpush': LPUSH the payload (consumers BRPOP, e.g. Celery's Redis transport, a plain ready list)
--   mode 'rpush': RPUSH the payload (consumers LPOP)
--   mode 'hash':  HSET hash <field> payload, then RPUSH list <field>, where <field> is the envelope header's
--                 'h' (Dramatiq's RedisBroker: <ns>:<queue>.msgs and <ns>:<queue>)
-- Returns {now_ms, next_due_ms (-1: nothing parked), promoted, dead_lettered, lateness_ms...}.
-- An envelope with no route among these goes to the dead letters: a stored message can reach only the
-- queues the application declared.

local problem = wrong_type(KEYS[1], 'zset', KEYS[7], 'zset')
if problem then
    return problem
end
local batch = tonumber(ARGV[1])
local now = now_ms()
redis.call('ZADD', KEYS[7], now, ARGV[2])

local routes = {}
for k = 0, (#ARGV - 2) / 2 - 1 do
    routes[ARGV[3 + 2 * k]] = {list = KEYS[8 + 2 * k], hash = KEYS[9 + 2 * k], mode = ARGV[4 + 2 * k]}
end

local promoted, dead = 0, 0
local result = {now, -1, 0, 0}
local ready = count_due(KEYS[1], now, batch)
if ready > 0 then
    -- Every key written below must hold the right type before the first write (see wrong_type).
    local spec = {KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash', KEYS[6], 'hash'}
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
    local ids, due = pop_due(KEYS[1], ready)
    local envelopes = redis.call('HMGET', KEYS[2], unpack(ids))
    redis.call('HDEL', KEYS[2], unpack(ids))
    -- Attempts and errors exist only for messages that failed before: skip the work when there are none.
    if redis.call('EXISTS', KEYS[4]) == 1 then
        redis.call('HDEL', KEYS[4], unpack(ids))
    end
    if redis.call('EXISTS', KEYS[5]) == 1 then
        redis.call('HDEL', KEYS[5], unpack(ids))
    end

    -- Pushes are grouped per route, in due order, so each batch costs one push per route.
    local pushes, order = {}, {}
    local function fail(id, envelope, reason)
        dead_letter(KEYS[3], KEYS[5], KEYS[6], id, reason, now)
        if envelope then
            redis.call('HSET', KEYS[2], id, envelope)
        end
        dead = dead + 1
    end
    for n, id in ipairs(ids) do
        local envelope = envelopes[n]
        if not envelope then
            fail(id, nil, 'missing payload: no envelope stored for this id')
        else
            local header, payload, problem = open_envelope(envelope)
            local route = header and routes[header.r]
            if problem then
                fail(id, envelope, problem)
            elseif header.v ~= 1 then
                fail(id, envelope, 'unsupported envelope version ' .. cjson.encode(header.v))
            elseif type(header.r) ~= 'string' then
                fail(id, envelope, 'malformed envelope: no route')
            elseif not route then
                fail(id, envelope, 'unknown route ' .. cjson.encode(header.r) .. ': not declared by the application')
            elseif route.mode == 'hash' and type(header.h) ~= 'string' then
                fail(id, envelope, 'malformed envelope: no hash field for route ' .. header.r)
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
                result[4 + promoted] = now - due_of(due[n * 2])
            end
        end
    end
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
        redis.call('HINCRBY', KEYS[6], 'promoted', promoted)
    end
end

local next_due = head_due(KEYS[1])
if next_due then
    result[2] = next_due
end
result[3] = promoted
result[4] = dead
return result
