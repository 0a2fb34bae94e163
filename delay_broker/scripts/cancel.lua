-- cancel.lua: remove parked or dead-lettered messages before they are promoted.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DUE       ZSET id -> score
--   MSG       HASH id -> envelope
--   INFLIGHT  ZSET id -> lease deadline ('replace' only)
--   LEASED    HASH id -> due score while in flight ('replace' only)
--   DEAD      ZSET id -> dead-lettered at
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters
-- ARGV[1] 'cancel', or 'replace': the messages are replaced by far-tier rows of the same ids, so a copy a
--         promoter holds goes too, as park.lua replaces one (its delivery is under way or done: counted as
--         promoted here, for the promoter's ack will find no lease to count)
-- ARGV[2..] ids
-- Returns one flag per id: 1 = removed, 0 = not parked (unknown, already promoted, or in flight, unless
-- 'replace').

local replacing = ARGV[1] == 'replace'
local problem = denied_command()
    or wrong_type(DUE, 'zset', MSG, 'hash', DEAD, 'zset', ATTEMPTS, 'hash', ERRORS, 'hash',
        STATS, 'hash')
    or (replacing and wrong_type(INFLIGHT, 'zset', LEASED, 'hash'))
if problem then
    return problem
end

local result = {}
local removed = {}
local cancelled, delivered = 0, 0
for i = 2, #ARGV do
    local id = ARGV[i]
    result[i - 1] = 1
    if redis.call('ZREM', DUE, id) == 1 or redis.call('ZREM', DEAD, id) == 1 then
        cancelled = cancelled + 1  -- not counted when replacing: the far row is the same message, parked again
    elseif replacing and redis.call('ZREM', INFLIGHT, id) == 1 then
        redis.call('HDEL', LEASED, id)
        delivered = delivered + 1
    else
        result[i - 1] = 0
    end
    if result[i - 1] == 1 then
        removed[#removed + 1] = id
    end
end
if #removed > 0 then
    redis.call('HDEL', MSG, unpack(removed))
    redis.call('HDEL', ATTEMPTS, unpack(removed))
    redis.call('HDEL', ERRORS, unpack(removed))
end
if cancelled > 0 and not replacing then
    redis.call('HINCRBY', STATS, 'cancelled', cancelled)
end
if delivered > 0 then
    redis.call('HINCRBY', STATS, 'promoted', delivered)
end
return result
