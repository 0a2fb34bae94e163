-- rehome.lua: park a batch a reshard took out of another shard (rehome_take.lua) into this shard, their new home,
-- once: unless the batch's token is in REHOMED already, each parked message is parked as park.lua parks with
-- 'keep' (same id, due time and envelope, its attempts and last error; into a pack when it is due far enough
-- ahead), each dead letter is made a dead letter again, unless the shard holds its id (a later park of it), and
-- the token is added. Parking a batch again after its messages were promoted from here thus parks none of them
-- again (see delay_broker/store/rehoming.py).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   LEASED    HASH id -> due score while in flight
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   WAKE      LIST wake marker
--   STATS     HASH counters ('rehomed'; 'pack_damaged')
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape (see pack_locate)
--   GENERATION    STRING the shard's layout generation (see layout_refusal)
--   REHOMED   SET tokens of the batches parked here
-- KEYS after the shard's, three per message (id_keys): its packed index partition, the pack the caller says it is
--   in, the pack to append it to if it is due far enough ahead (PACKS: none)
-- ARGV[1] the layout generation the caller parks by  ARGV[2] the batch's token
-- ARGV[3] min_ahead_ms: a message due at least this far ahead is packed when given a pack; -1 never
-- ARGV[4] n, the messages  ARGV[5 .. 4 + n] per message 'd' (parked) or 'x' (dead) and its attempts: 'd 2'
-- ARGV[5 + n .. 4 + 2n] per message its last error ('' for none)
-- ARGV[5 + 2n .. #ARGV - 4] groups of 3: id, due time or when it died ('@' and epoch ms), envelope ('' for a dead
--         letter whose envelope went missing)
-- ARGV[#ARGV - 3] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms, their packed locations and the
--         key map (see by_id_trailer and id_keys)
-- Returns park.lua's reply (outcome 0 for a message kept: the shard holds its id already; 4 for a dead letter), or
-- {-1} when the token is in REHOMED already (nothing written); or a refusal, having written nothing.

local refused = layout_refusal(GENERATION, ARGV[1])
if refused then
    return refused
end
local token, count = ARGV[2], tonumber(ARGV[4])
if redis.call('SISMEMBER', REHOMED, token) == 1 then
    return {-1}
end
local k = {due = DUE, msg = MSG, inflight = INFLIGHT, leased = LEASED, dead = DEAD, attempts = ATTEMPTS,
    errors = ERRORS, wake = WAKE, stats = STATS, packs = PACKS, pack_base = PACK_BASE, pack_live = PACK_LIVE}
local keys = id_keys(count, 3)
local shape, binaries, locations = by_id_trailer()
local now = now_ms()
local messages, refusal = park_messages(5 + 2 * count, count, now, -1, keys, binaries)
if not messages then
    return refusal
end
local problem = wrong_type(MSG, 'hash', DUE, 'zset', INFLIGHT, 'zset', DEAD, 'zset', ATTEMPTS, 'hash', ERRORS,
    'hash', PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash', REHOMED, 'set') or id_keys_wrong_type(keys)
if problem then
    return problem
end
local skip = {}
for n, message in ipairs(messages) do
    local kind, attempts = string.match(ARGV[4 + n], '^([dx]) (%d+)$')
    if not kind then
        return redis.error_reply('ERR delay_broker: malformed re-homed message ' .. message.id)
    end
    message.attempts, message.error = tonumber(attempts), ARGV[4 + count + n]
    skip[n] = kind == 'x'
end
local places, stale
places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if problem then
    return problem
end
local damaged_packs, head = plan_park(k, messages, places, false, skip, now, tonumber(ARGV[3]))
local writing, wakes = check_park(k, messages, false, skip, head, 'rehomed')
if not writing then
    return wakes
end
local result, delivered, filled, earlier_packs = write_park(k, messages, false, skip, stale)

-- What park.lua does not carry: attempts and errors of the messages written, and the dead letters.
local dead = 0
for n, message in ipairs(messages) do
    local written = result[2 * n] == 1
    if skip[n] and not message.held then
        redis.call('ZADD', DEAD, message.due, message.id)
        if message.envelope ~= '' then
            redis.call('HSET', MSG, message.id, message.envelope)
        end
        dead, written = dead + 1, true
    end
    if written and message.attempts > 0 then
        redis.call('HSET', ATTEMPTS, message.id, message.attempts)
    end
    if written and message.error ~= '' then
        redis.call('HSET', ERRORS, message.id, message.error)
    end
end
if dead > 0 then
    redis.call('HINCRBY', STATS, 'rehomed', dead)
end
redis.call('SADD', REHOMED, token)
return finish_park(k, result, delivered, filled, earlier_packs, wakes, damaged_packs)
