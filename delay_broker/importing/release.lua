-- release.lua: entries an import parked leave its staging list for good, with their payloads when the queue keeps
-- them in a hash (Dramatiq's RedisBroker: the list holds ids, <queue>.msgs the messages), in one step.
-- KEYS[1]   the import's staging list
-- KEYS[2]   optional: the queue's hash of payloads, by entry
-- ARGV[1..] the entries parked
-- Returns how many entries left the staging list (an entry another import released already counts 0).

local released = 0
for i = 1, #ARGV do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) > 0 then
    released = released + 1
    if KEYS[2] then
      redis.call('HDEL', KEYS[2], ARGV[i])
    end
  end
end
return released
