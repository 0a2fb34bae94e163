-- find.lua: a bounded scan of one state's index for the messages that match structural filters.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score (scanned when ARGV[1] is 'due')
--   INFLIGHT  ZSET id -> lease deadline (scanned when ARGV[1] is 'inflight')
--   DEAD      ZSET id -> dead-lettered at (scanned when ARGV[1] is 'dead')
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
-- ARGV[1] state: 'due', 'inflight' or 'dead'
-- ARGV[2] min score  ARGV[3] max score: the window scanned (ZRANGEBYSCORE bounds)
-- ARGV[4] after score  ARGV[5] after id: where the last call stopped ('' and '': at the window's start). The
--         scan goes on with the entries that sort after that one (by score, then id), wherever it is now: a
--         position, unlike an offset, is not moved by entries promoted, cancelled or parked meanwhile.
-- ARGV[6] scan: most entries examined by this call (<= 5000: one call stays short for Redis)
-- ARGV[7] limit: most matches returned (<= 1000)
-- ARGV[8] queue (the envelope's route) or '' for any   ARGV[9] name (actor or task) or '' for any
-- ARGV[10] id prefix or '' for any
-- ARGV[11] '1': envelopes without their payload (see without_payload), else whole
-- Returns {examined, exhausted (1 when the window has nothing after the last entry examined), the score and id
-- of the last entry examined (the position to go on from; ARGV[4] and ARGV[5] when none was), then five
-- entries per match: id, score, envelope or false, attempts, last error or false}.
-- A message whose envelope cannot be read matches no queue or name filter (it still matches the others).

local INDEX = ({due = DUE, inflight = INFLIGHT, dead = DEAD})[ARGV[1]]
if not INDEX then
    return redis.error_reply('ERR unknown state ' .. tostring(ARGV[1]))
end
local problem = wrong_type(INDEX, 'zset', MSG, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash')
if problem then
    return problem
end
local min, max = ARGV[2], ARGV[3]
local after_score, after_id = ARGV[4], ARGV[5]
local scan, limit = tonumber(ARGV[6]), tonumber(ARGV[7])
local queue, name, prefix = ARGV[8], ARGV[9], ARGV[10]
local needs_header = queue ~= '' or name ~= ''
local CHUNK = 500

-- Members of one score sort byte by byte, as here (Lua's own comparison follows the server's locale).
local function sorts_after(a, b)
    for i = 1, math.min(#a, #b) do
        local x, y = string.byte(a, i), string.byte(b, i)
        if x ~= y then
            return x > y
        end
    end
    return #a > #b
end

-- Entries at after_score up to after_id were scanned: skip them. Usually after_id is still there and its rank
-- says how many; else (promoted, cancelled, rescheduled) the entries of that score are compared with it.
local skip = 0
if after_score ~= '' then
    min = after_score
    local score = redis.call('ZSCORE', INDEX, after_id)
    if score and tonumber(score) == tonumber(after_score) then
        skip = redis.call('ZRANK', INDEX, after_id) - redis.call('ZCOUNT', INDEX, '-inf', '(' .. after_score) + 1
    else
        local done = false
        while not done do
            local ties = redis.call('ZRANGEBYSCORE', INDEX, after_score, after_score, 'LIMIT', skip, CHUNK)
            done = #ties < CHUNK
            for _, id in ipairs(ties) do
                if sorts_after(id, after_id) then
                    done = true
                    break
                end
                skip = skip + 1
            end
        end
    end
end

local result = {0, 0, after_score, after_id}
local examined, matched = 0, 0
while examined < scan and matched < limit do
    local size = math.min(CHUNK, scan - examined)
    local page = redis.call('ZRANGEBYSCORE', INDEX, min, max, 'WITHSCORES', 'LIMIT', skip + examined, size)
    local count = #page / 2
    if count == 0 then
        result[2] = 1
        break
    end
    local offset_of_chunk_end = examined + count
    local ids = {}
    for i = 1, #page, 2 do
        ids[#ids + 1] = page[i]
    end
    local envelopes = needs_header and redis.call('HMGET', MSG, unpack(ids)) or {}
    for n, id in ipairs(ids) do
        local ok = prefix == '' or string.sub(id, 1, #prefix) == prefix
        if ok and needs_header then
            local header = envelopes[n] and open_envelope(envelopes[n])
            ok = header ~= nil and header ~= false
                and (queue == '' or header.r == queue) and (name == '' or header.n == name)
        end
        examined = examined + 1
        result[3], result[4] = page[n * 2], id
        if ok then
            matched = matched + 1
            result[#result + 1] = id
            result[#result + 1] = page[n * 2]
            local envelope = needs_header and envelopes[n] or redis.call('HGET', MSG, id)
            result[#result + 1] = ARGV[11] == '1' and without_payload(envelope) or envelope
            result[#result + 1] = tonumber(redis.call('HGET', ATTEMPTS, id) or 0) or 0
            result[#result + 1] = redis.call('HGET', ERRORS, id)
            if matched >= limit then
                break
            end
        end
    end
    if count < size then
        -- The window ended inside this chunk; it is exhausted if the limit did not stop the loop before its end.
        if matched < limit or examined == offset_of_chunk_end then
            result[2] = 1
        end
        break
    end
end
result[1] = examined
return result
