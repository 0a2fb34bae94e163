-- give_back.lua: entries an import took and cannot park go back from its staging list to the queue, at the end
-- consumers take from next, in one step.
-- KEYS[1]   the import's staging list
-- KEYS[2]   the queue list
-- ARGV[1]   'LPUSH' (consumers pop the head) or 'RPUSH' (they pop the tail)
-- ARGV[2..] the entries
-- Returns how many entries went back.

local push = ARGV[1]
if push ~= 'LPUSH' and push ~= 'RPUSH' then
  return redis.error_reply('ERR push must be LPUSH or RPUSH')
end
local returned = 0
for i = 2, #ARGV do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) > 0 then
    redis.call(push, KEYS[2], ARGV[i])
    returned = returned + 1
  end
end
return returned
