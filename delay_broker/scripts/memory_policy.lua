-- memory_policy.lua: the server's maxmemory and maxmemory-policy, read only where the ACL user may read them.
-- KEYS: one key of a shard (not touched: it routes the call to the shard's node on a Cluster).
-- ARGV: none.
-- Returns {maxmemory in bytes, policy}, or {} when the user may not run INFO. Asked here rather than with INFO
-- from the client: on Redis 7+ redis.acl_check_cmd answers without a refusal, which Redis would put in its ACL
-- LOG for whoever watches it (the documented least-privilege user has no +info). Redis 6.2 has no such check:
-- there INFO is tried, and a refusal is the answer.

if redis.acl_check_cmd and not redis.acl_check_cmd('INFO') then
    return {}
end
local ok, info = pcall(redis.call, 'INFO', 'memory')
if not ok then
    return {}
end
local maxmemory = string.match(info, 'maxmemory:(%d+)')
local policy = string.match(info, 'maxmemory_policy:([%w-]+)')
if not maxmemory or not policy then
    return {}
end
return {tonumber(maxmemory), policy}
