-- take.lua: take entries an import is about to park out of a broker's queue list, into the import's staging list,
-- in one step: each entry is in exactly one of the two lists at any time. An entry no longer in the queue (a
-- consumer took it since the import read it) is not taken.
-- KEYS[1]   the queue list
-- KEYS[2]   the import's staging list for it
-- ARGV[1]   1 to look for each entry from the list's head (LREM count 1), -1 from its tail (count -1)
-- ARGV[2..] the entries, as read from the queue
-- Returns the entries taken, in the order given.

local direction = tonumber(ARGV[1])
local taken = {}
for i = 2, #ARGV do
  if redis.call('LREM', KEYS[1], direction, ARGV[i]) > 0 then
    redis.call('RPUSH', KEYS[2], ARGV[i])
    taken[#taken + 1] = ARGV[i]
  end
end
return taken
