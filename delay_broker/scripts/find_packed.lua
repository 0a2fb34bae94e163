-- find_packed.lua: a bounded scan of one pack for the messages that match structural filters (find.lua's
-- counterpart for packed messages; see delay_broker/packing.py).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   PACK_BASE HASH pack name -> records taken from its head
--   ATTEMPTS  HASH id -> failed attempts (of a message packed by a reschedule)
--   ERRORS    HASH id -> last error
-- KEYS after the shard's: the pack
-- ARGV[1] the pack's name
-- ARGV[2] position to go on after (counted from the pack's first record), or -1 for its start
-- ARGV[3] scan: most records examined by this call (<= 5000)
-- ARGV[4] limit: most matches returned (<= 1000)
-- ARGV[5] queue (the envelope's route) or '' for any   ARGV[6] name (actor or task) or '' for any
-- ARGV[7] id prefix or '' for any
-- ARGV[8] '1': envelopes without their payload (see without_payload), else whole
-- ARGV[9], ARGV[10] earliest and latest due time (ms) matched, or '' for no bound
-- Returns {examined, exhausted (1 when the pack has nothing after the last record examined), the position of
-- the last record examined (ARGV[2] when none was), then six entries per match: id, due score, envelope,
-- attempts, last error or false, its position}. Cleared records (taken out by id) are passed over.

local PACK = KEYS[FIRST_EXTRA_KEY]
local problem = wrong_type(PACK, 'list', PACK_BASE, 'hash')
if problem then
    return problem
end
local after, scan, limit = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local queue, name, prefix = ARGV[5], ARGV[6], ARGV[7]
local earliest, latest = tonumber(ARGV[9]), tonumber(ARGV[10])
local needs_header = queue ~= '' or name ~= ''
local base = tonumber(redis.call('HGET', PACK_BASE, ARGV[1]) or '0') or 0
local from = math.max(after + 1, base)
local CHUNK = 500

local result = {0, 0, after}
local examined, matched = 0, 0
while examined < scan and matched < limit do
    local size = math.min(CHUNK, scan - examined)
    local start = from - base + examined
    local records = redis.call('LRANGE', PACK, start, start + size - 1)
    local chunk_end = examined + #records
    for n, record in ipairs(records) do
        examined = examined + 1
        result[3] = base + start + n - 1
        local due = #record > PACK_HEADER and packed_due(record)
        if due and (not earliest or due >= earliest) and (not latest or due <= latest) then
            local id = uuid_text(record, 1)
            local envelope = string.sub(record, PACK_HEADER + 1)
            local ok = prefix == '' or string.sub(id, 1, #prefix) == prefix
            if ok and needs_header then
                local header = open_envelope(envelope)
                ok = header ~= nil and header ~= false
                    and (queue == '' or header.r == queue) and (name == '' or header.n == name)
            end
            if ok then
                matched = matched + 1
                result[#result + 1] = id
                result[#result + 1] = string.format('%d', due * FIFO_SLOTS)
                result[#result + 1] = ARGV[8] == '1' and without_payload(envelope) or envelope
                result[#result + 1] = tonumber(redis.call('HGET', ATTEMPTS, id) or 0) or 0
                result[#result + 1] = redis.call('HGET', ERRORS, id)
                result[#result + 1] = base + start + n - 1
                if matched >= limit then
                    break
                end
            end
        end
    end
    if #records < size then
        if matched < limit or examined == chunk_end then
            result[2] = 1
        end
        break
    end
end
result[1] = examined
return result
