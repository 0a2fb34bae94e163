-- repair_shape.lua: set the packed index's shape when it is malformed, to the one `delay-broker check` rebuilt
-- from the partitions present (see delay_broker/store/checking.py). Nothing writes the index while its shape is
-- malformed (every script that would refuses: DAMAGED), so the partitions are still those the check found.
-- KEYS: one shard's keys in delay_broker.keys.SCRIPT_KEYS order, named by the prelude. Uses:
--   PACKED_SHAPE  STRING the packed index's shape ('level:split')
-- KEYS after the shard's: none.
-- ARGV[1] 'check' (reads only: is it still as read) or 'repair'
-- ARGV[2] the shape as the check read it
-- ARGV[3] the shape to set
-- Returns {1} (as read, and malformed: set, unless checking) or {0} (changed meanwhile: left alone); or a
-- refusal, having written nothing.

local problem = wrong_type(PACKED_SHAPE, 'string')
if problem then
    return problem
end
local stored = redis.call('GET', PACKED_SHAPE)
if stored ~= ARGV[2] or index_shape(PACKED_SHAPE) then
    return {0}
end
local level, split = string.match(ARGV[3], '^(%d+):(%d+)$')
if not level or tonumber(level) > 30 or tonumber(split) >= 2 ^ tonumber(level) then
    return redis.error_reply('ERR delay_broker: not a shape of the packed index: ' .. ARGV[3])
end
if ARGV[1] ~= 'check' then
    redis.call('SET', PACKED_SHAPE, ARGV[3])
end
return {1}
