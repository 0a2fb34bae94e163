-- adopt.lua: move far-tier rows into Redis (see delay_broker/far): each parked as park.lua parks with 'keep',
-- unless its row was moved in before, by a mover that died before deleting it.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   LEASED    HASH id -> due score while in flight
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   WAKE      LIST wake marker
--   STATS     HASH counters ('moved_in', 'replaced', 'promoted'; 'pack_damaged')
--   MOVED     ZSET far-tier token -> when its message was moved in
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape (see pack_locate)
--   GENERATION    STRING the shard's layout generation (see layout_refusal)
-- KEYS after the shard's, three per row (id_keys): its id's packed index partition, the pack the caller says it
--   is in, the pack to append it to if it is due far enough ahead (PACKS: none)
-- ARGV[1] the mover's deadline (Redis TIME, ms): past it the mover's PostgreSQL locks may be gone and another
--         mover may hold the rows, so nothing is written
-- ARGV[2] min_ahead_ms: a message due at least this far ahead is packed when given a pack; -1 never
-- ARGV[3] the rows' tokens, space-separated, in row order. A token already in MOVED was moved in before: that
--         row is skipped. Every token is recorded (again), so that a row moved in is never moved in twice (nor
--         run twice), and the WAIT that follows this call covers an earlier move that may not have been confirmed.
-- ARGV[4] the layout generation the mover parks by (see layout_refusal)
-- ARGV[5..#ARGV - 4] groups of 3: id, due time ('@' and epoch ms), record
-- ARGV[#ARGV - 3] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms, their packed locations
--         and the key map (see by_id_trailer and id_keys)
-- Returns park.lua's reply; outcome 4 for a row skipped, moved in before (due_ms -1). Or a refusal, having written
-- nothing ('LEASEGONE' past the deadline, or the refusal of layout_refusal).

local k = {due = DUE, msg = MSG, inflight = INFLIGHT, leased = LEASED, dead = DEAD, attempts = ATTEMPTS,
    errors = ERRORS, wake = WAKE, stats = STATS, packs = PACKS, pack_base = PACK_BASE, pack_live = PACK_LIVE}
local refused = layout_refusal(GENERATION, ARGV[4])
if refused then
    return refused
end
local count = (#ARGV - 8) / 3
local keys = id_keys(count, 3)
local shape, binaries, locations = by_id_trailer()
local now = now_ms()
if now >= tonumber(ARGV[1]) then
    return redis.error_reply('LEASEGONE far-tier move refused: its lease ran out (another mover may own the rows)')
end
local messages, refusal = park_messages(5, count, now, -1, keys, binaries)
if not messages then
    return refusal
end
local problem = wrong_type(MSG, 'hash', DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', MOVED, 'zset', PACKS, 'zset',
    PACK_BASE, 'hash', PACK_LIVE, 'hash') or id_keys_wrong_type(keys)
if problem then
    return problem
end
local tokens, skip = {}, {}
for token in string.gmatch(ARGV[3], '%S+') do
    tokens[#tokens + 1] = token
    skip[#tokens] = redis.call('ZSCORE', MOVED, token) ~= false
end
local places, stale
places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if problem then
    return problem
end
local damaged_packs, head = plan_park(k, messages, places, false, skip, now, tonumber(ARGV[2]))
local writing, wakes = check_park(k, messages, false, skip, head, 'moved_in')
if not writing then
    return wakes
end
local result, delivered, filled, earlier_packs = write_park(k, messages, false, skip, stale)
for _, token in ipairs(tokens) do
    redis.call('ZADD', MOVED, now, token)
end
return finish_park(k, result, delivered, filled, earlier_packs, wakes, damaged_packs)
