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
--   STATS     HASH counters ('parked', 'replaced', 'promoted'; 'pack_damaged')
--   MOVED     ZSET far-tier token -> when its message was moved in (the far rows a park replaces)
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape (see pack_locate)
--   GENERATION    STRING the shard's layout generation (see layout_refusal)
-- KEYS after the shard's, three per message (id_keys): its packed index partition, the pack the caller says it
--   is packed in (see pack_locate), and the pack to append it to if it is due far enough ahead (PACKS: none).
-- ARGV[1] on_conflict: 'replace' (reschedule and replace the payload) or 'keep' (leave an existing id alone)
-- ARGV[2] max_delay_ms: latest due time accepted, counted from Redis TIME (the store's max_delay), or -1
-- ARGV[3] min_ahead_ms: a message due at least this far ahead is packed when given a pack; -1 never
-- ARGV[4] the far-tier tokens of the rows this park replaces, space-separated ('' for none): their delete
--         commits only after it, so they are recorded in MOVED, and a row whose delete failed is never moved in
-- ARGV[5] the layout generation the caller parks by (see layout_refusal)
-- ARGV[6..#ARGV - 4] groups of 3: id, due time ('123': ms from Redis TIME; '@123': epoch ms), envelope
-- ARGV[#ARGV - 3] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms, their packed locations
--         and the key map (see by_id_trailer and id_keys)
-- Returns a flat list, two entries per message: due_ms, outcome (1 = new, 2 = replaced, 0 = kept existing,
-- whose due_ms is its current due time, or -1 when it is in flight or dead); then 1 if WAKE was pushed, else
-- 0; the highest index partition this call filled past SPLIT_AT and the entries of the fullest, or -1 and 0;
-- the packs not used because their bookkeeping is damaged, space-separated. Or a refusal, having written
-- nothing: of layout_refusal, of pack_locate, a due time out of bounds, a key of the wrong type.

local k = {due = DUE, msg = MSG, inflight = INFLIGHT, leased = LEASED, dead = DEAD, attempts = ATTEMPTS,
    errors = ERRORS, wake = WAKE, stats = STATS, packs = PACKS, pack_base = PACK_BASE, pack_live = PACK_LIVE}
local refused = layout_refusal(GENERATION, ARGV[5])
if refused then
    return refused
end
local replace = ARGV[1] == 'replace'
local retired = ARGV[4]
local count = (#ARGV - 9) / 3
local keys = id_keys(count, 3)
local shape, binaries, locations = by_id_trailer()
local now = now_ms()
-- Validate everything before writing anything: a script error does not roll back earlier writes.
local messages, refusal = park_messages(6, count, now, tonumber(ARGV[2]), keys, binaries)
if not messages then
    return refusal
end

-- Reads first, writes after, so that a key of the wrong type stops the script before it changes anything. The
-- reads check the types of the keys they touch for free; only when one fails are all keys examined, to name
-- the culprit.
local skip, stale, damaged_packs, head = {}, nil, nil, nil
local read_ok, read_error = pcall(function()
    local places, problem
    places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
    if problem then
        error(problem)
    end
    damaged_packs, head = plan_park(k, messages, places, replace, skip, now, tonumber(ARGV[3]))
end)
if not read_ok then
    -- A refusal of pack_locate as it made it; else a key of the wrong type, named; else the refusal as raised.
    local text = type(read_error) == 'table' and read_error.err
    if text and (string.find(text, '^PACKED ') or string.find(text, '^RESHAPED ')
            or string.find(text, '^DAMAGED ')) then
        return read_error
    end
    return wrong_type(MSG, 'hash', DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', PACKS, 'zset', PACK_BASE, 'hash',
        PACK_LIVE, 'hash') or id_keys_wrong_type(keys)
        or redis.error_reply(text and tostring(text) or tostring(read_error))
end

local problem = retired ~= '' and wrong_type(MOVED, 'zset')
if problem then
    return problem
end
local writing, wakes = check_park(k, messages, replace, skip, head, 'parked')
if not writing then
    return wakes
end
local result, delivered, filled, earlier_packs = write_park(k, messages, replace, skip, stale)
for token in string.gmatch(retired, '%S+') do
    redis.call('ZADD', MOVED, now, token)
end
return finish_park(k, result, delivered, filled, earlier_packs, wakes, damaged_packs)
