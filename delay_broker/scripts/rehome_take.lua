-- rehome_take.lua: take messages a reshard moves out of this shard (their home is another shard in the new layout)
-- into MOVING, each in one step: out of its index (DUE, a pack, DEAD) and into MOVING with all the store knows of
-- it, so promoters no longer see it and reads by id still find it (see delay_broker/store/rehoming.py). A message
-- in flight is left where it is (its promoter acknowledges it here), one that is gone is skipped.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters ('pack_damaged')
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_BASE HASH pack name -> records taken from its head
--   PACK_LIVE HASH pack name -> messages packed in it
--   PACKED_SHAPE  STRING the packed index's shape (see pack_locate)
--   MOVING    HASH id -> the message in transit: 'token kind time attempts taken_ms error_length error' and the
--             envelope run together (kind 'd': parked, time its due ms; 'x': dead, time when it died)
-- KEYS after the shard's, two per id (id_keys): its packed index partition and the pack it is said to be in
-- ARGV[1] the batch's token  ARGV[2] bytes of MOVING values to take at most (the first message is taken whatever
--         its size; the ids after the budget is spent are left for another batch)
-- ARGV[3..#ARGV - 4] ids
-- ARGV[#ARGV - 3] .. ARGV[#ARGV]: the packed index's shape, the ids' 16-byte forms, their packed locations and the
--         key map (see by_id_trailer and id_keys)
-- Returns one code per id (0 not held, 1 in flight (left), 2 parked and taken, 3 dead and taken, 4 left for another
-- batch), then the MOVING value of each one taken, in order; or a refusal, having written nothing.

local count = #ARGV - 6
local keys = id_keys(count, 2)
local problem = wrong_type(DUE, 'zset', MSG, 'hash', INFLIGHT, 'zset', DEAD, 'zset', ATTEMPTS, 'hash',
    ERRORS, 'hash', STATS, 'hash', PACKS, 'zset', PACK_BASE, 'hash', PACK_LIVE, 'hash', MOVING, 'hash')
    or id_keys_wrong_type(keys)
if problem then
    return problem
end
local shape, binaries, locations = by_id_trailer()
local places, stale
places, stale, problem = pack_locate(keys, shape, binaries, locations, PACK_BASE, PACK_LIVE, PACKED_SHAPE)
if problem then
    return problem
end
drop_stale(stale, STATS)

local token, budget = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local codes, values, used = {}, {}, 0

-- Into MOVING first (the write that grows memory: over maxmemory Redis refuses it before the message leaves its
-- index), then out of the shard's other hashes; the caller takes it out of its index.
local function take(id, kind, at, envelope)
    local error = redis.call('HGET', ERRORS, id) or ''
    local value = token .. ' ' .. kind .. ' ' .. at .. ' ' .. (redis.call('HGET', ATTEMPTS, id) or '0') .. ' '
        .. now .. ' ' .. #error .. ' ' .. error .. envelope
    redis.call('HSET', MOVING, id, value)
    redis.call('HDEL', MSG, id)
    redis.call('HDEL', ATTEMPTS, id)
    redis.call('HDEL', ERRORS, id)
    values[#values + 1] = value
    used = used + #value
end

for n = 1, count do
    local id = ARGV[n + 2]
    local score
    if used > 0 and used >= budget then
        codes[n] = 4
    elseif places[n] then
        local record = places[n].record
        take(id, 'd', packed_due(record) or now, string.sub(record, PACK_HEADER + 1))
        pack_take(places[n], PACKS, PACK_BASE, PACK_LIVE)
        codes[n] = 2
    else
        score = redis.call('ZSCORE', DUE, id)
        if score then
            take(id, 'd', due_of(score), redis.call('HGET', MSG, id) or '')
            redis.call('ZREM', DUE, id)
            codes[n] = 2
        else
            score = redis.call('ZSCORE', DEAD, id)
            if score then
                take(id, 'x', math.floor(tonumber(score)), redis.call('HGET', MSG, id) or '')
                redis.call('ZREM', DEAD, id)
                codes[n] = 3
            elseif redis.call('ZSCORE', INFLIGHT, id) then
                codes[n] = 1
            else
                codes[n] = 0
            end
        end
    end
end
for _, value in ipairs(values) do
    codes[#codes + 1] = value
end
return codes
