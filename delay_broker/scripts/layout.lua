-- layout.lua: write the namespace's shard layout (its layout key) only if it still holds what the caller read: the
-- steps of a reshard (see delay_broker/store/resharding.py). The last step also adds, in the same script, the
-- counters of the shards the reshard leaves to shard 0's: they are counted once, whenever the step is taken.
-- KEYS: shard 0's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   STATS     HASH counters
--   LATENESS  HASH lateness bucket -> messages promoted that late
-- KEYS after the shard's: the layout key
-- ARGV[1] the value the caller read ('' for none)  ARGV[2] the value to write
-- ARGV[3] n: the pairs for STATS that follow  ARGV[4 .. 3 + 2n] counter name, amount, ...; then pairs for LATENESS
--         to the end
-- Returns {1} when written; else {0, the value the key holds (false for none)}, having written nothing.

local key = KEYS[FIRST_EXTRA_KEY]
local held = redis.call('GET', key)
if (held or '') ~= ARGV[1] then
    return {0, held}
end
local problem = wrong_type(STATS, 'hash', LATENESS, 'hash')
if problem then
    return problem
end
local pairs_end = 3 + 2 * tonumber(ARGV[3])
redis.call('SET', key, ARGV[2])
-- After the step, best effort: a counter is a figure, and one spoiled in shard 0 must not hold up the layout.
for n = 4, pairs_end, 2 do
    redis.pcall('HINCRBY', STATS, ARGV[n], ARGV[n + 1])
end
for n = pairs_end + 1, #ARGV, 2 do
    redis.pcall('HINCRBY', LATENESS, ARGV[n], ARGV[n + 1])
end
return {1}
