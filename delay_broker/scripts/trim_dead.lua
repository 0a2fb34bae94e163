-- trim_dead.lua: bounded retention of dead letters. Drops the oldest dead letters past a count and those
-- dead-lettered longer ago than an age, with their envelope, attempts and last error, and counts them in
-- STATS as dead_dropped (a dropped letter is gone for good: operators must be able to see that it happened).
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   DEAD      ZSET id -> dead-lettered at (ms)
--   MSG       HASH id -> envelope
--   ATTEMPTS  HASH id -> failed attempts
--   ERRORS    HASH id -> last error
--   STATS     HASH counters (dead_dropped)
-- ARGV[1] max_count: dead letters to keep at most, or -1 for no bound by count
-- ARGV[2] max_age_ms: drop dead letters older than this (by the Redis clock), or -1 for no bound by age
-- ARGV[3] limit (<= 1000): most dead letters dropped by this call, so one call never blocks Redis for long
-- Returns {dropped, 1 if more are left to drop (call again), else 0}.

local problem = denied_command()
    or wrong_type(DEAD, 'zset', MSG, 'hash', ATTEMPTS, 'hash', ERRORS, 'hash', STATS, 'hash')
if problem then
    return problem
end

local max_count = tonumber(ARGV[1])
local max_age = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

-- The dead set is ordered by when each letter died, so both bounds drop a prefix of it: the n oldest, with
-- n the larger of "older than the age" and "more than the count".
local excess = 0
if max_count >= 0 then
    excess = redis.call('ZCARD', DEAD) - max_count
end
if max_age >= 0 then
    local aged = redis.call('ZCOUNT', DEAD, '-inf', '(' .. (now_ms() - max_age))
    if aged > excess then
        excess = aged
    end
end
if excess <= 0 then
    return {0, 0}
end

local take = math.min(excess, limit)
local ids = redis.call('ZRANGE', DEAD, 0, take - 1)
redis.call('ZREM', DEAD, unpack(ids))
redis.call('HDEL', MSG, unpack(ids))
redis.call('HDEL', ATTEMPTS, unpack(ids))
redis.call('HDEL', ERRORS, unpack(ids))
redis.call('HINCRBY', STATS, 'dead_dropped', #ids)
return {#ids, excess > take and 1 or 0}
