-- renew.lua: extend the lease of claimed messages whose delivery is still under way, so that a slow publish
-- (a broker that blocks its publishers, a reply slower than the lease) neither lets another promoter deliver
-- them a second time nor counts an attempt against them.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   INFLIGHT  ZSET id -> lease deadline
-- ARGV[1] lease deadline the holder has (from the claim or the last renewal)  ARGV[2] lease ms  ARGV[3..] ids
-- Returns {new lease deadline, how many ids it was extended for}. Only ids whose lease still has the given
-- deadline are extended: one already reclaimed by another promoter is left to it. The new deadline is the
-- holder's token from then on (ack and nack check it).

local problem = denied_command()
    or wrong_type(INFLIGHT, 'zset')
if problem then
    return problem
end
local deadline = tonumber(ARGV[1])
local renewed = now_ms() + tonumber(ARGV[2])
if renewed <= deadline then
    renewed = deadline + 1  -- always a new token, even with a clock that stepped back
end
local held = {}
for i = 3, #ARGV do
    local score = redis.call('ZSCORE', INFLIGHT, ARGV[i])
    if score and tonumber(score) == deadline then
        held[#held + 1] = ARGV[i]
    end
end
-- Removed, then added with the new deadline: over maxmemory Redis refuses a script's first write only if it
-- may grow memory (ZADD may), and a renewal refused while Redis is full let other promoters deliver again.
for _, id in ipairs(held) do
    redis.call('ZREM', INFLIGHT, id)
end
for _, id in ipairs(held) do
    redis.call('ZADD', INFLIGHT, renewed, id)
end
return {renewed, #held}
