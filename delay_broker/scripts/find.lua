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
-- ARGV[4] offset: where in the window to start (entries before it were scanned by earlier calls)
-- ARGV[5] scan: most entries examined by this call (<= 5000: one call stays short for Redis)
-- ARGV[6] limit: most matches returned (<= 1000)
-- ARGV[7] queue (the envelope's route) or '' for any   ARGV[8] name (actor or task) or '' for any
-- ARGV[9] id prefix or '' for any
-- Returns {examined, exhausted (1 when the window has nothing after the last entry examined), then six entries
-- per match: offset in the window, id, score, envelope or false, attempts, last error or false}.
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
local offset, scan, limit = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local queue, name, prefix = ARGV[7], ARGV[8], ARGV[9]
local needs_header = queue ~= '' or name ~= ''
local CHUNK = 500

local result = {0, 0}
local examined, matched = 0, 0
while examined < scan and matched < limit do
    local size = math.min(CHUNK, scan - examined)
    local page = redis.call('ZRANGEBYSCORE', INDEX, min, max, 'WITHSCORES', 'LIMIT', offset + examined, size)
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
        if ok then
            matched = matched + 1
            result[#result + 1] = offset + examined - 1
            result[#result + 1] = id
            result[#result + 1] = page[n * 2]
            result[#result + 1] = needs_header and envelopes[n] or redis.call('HGET', MSG, id)
            result[#result + 1] = tonumber(redis.call('HGET', ATTEMPTS, id) or 0)
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
