-- pack_audit.lua: list again in PACKS the packs their count (PACK_LIVE) says hold messages but PACKS no longer
-- lists (a hand-made change: deleting PACKS left every record in Redis, never opened, while stats said none),
-- so that promoters open them. Promoters call it now and then.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   STATS     HASH counters ('pack_damaged')
--   PACKS     ZSET pack name -> earliest due ms of its records
--   PACK_LIVE HASH pack name -> messages packed in it
-- ARGV: none.
-- Returns the names of the packs listed again. Each is listed with the start of its time slot, which is no
-- later than any of its records: it is opened a little early, never late.

local problem = wrong_type(STATS, 'hash', PACKS, 'zset', PACK_LIVE, 'hash')
if problem then
    return problem
end
local listed = {}
local counts = redis.call('HGETALL', PACK_LIVE)  -- not HKEYS: one command fewer for an ACL to grant
for i = 1, #counts, 2 do
    local name = counts[i]
    local width, slot = string.match(name, '^(%d+):(%d+)$')
    if width and not redis.call('ZSCORE', PACKS, name) then
        redis.call('ZADD', PACKS, tonumber(width) * tonumber(slot), name)
        listed[#listed + 1] = name
    end
end
count_damage(STATS, #listed)
return listed
