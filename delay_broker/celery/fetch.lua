-- fetch.lua: take the next task from kombu's Redis queue lists and record it as unacknowledged, in one step.
-- kombu pops with BRPOP and writes its unacked record only once the reply is parsed: a worker killed in
-- between (or while its prefetch is full and the reply waits in the socket) loses the task. Here the task is
-- never out of Redis without its record, which kombu's visibility_timeout restores from.
-- KEYS[1]   kombu's unacked index: ZSET delivery tag -> fetched at (seconds)
-- KEYS[2]   kombu's unacked hash: HASH delivery tag -> JSON [message, exchange, routing key]
-- KEYS[3..] queue lists, in the order BRPOP would take from them (priority, then queue)
-- ARGV[1]   now, in seconds, on the worker's clock (kombu's restore compares the index with its own clock)
-- ARGV[2..] one flag per queue list: '1' record the task, '0' do not (a no_ack consumer never acknowledges)
-- Returns {list key, message, recorded (1 or 0)} of the first task found, or nil when every list is empty.
-- A message without a delivery tag (not published by kombu) is handed over unrecorded, as kombu would.

for i = 3, #KEYS do
  local message = redis.call('RPOP', KEYS[i])
  if message then
    if ARGV[i - 1] ~= '1' then
      return {KEYS[i], message, 0}
    end
    local ok, decoded = pcall(cjson.decode, message)
    local properties = ok and type(decoded) == 'table' and decoded.properties
    local tag = type(properties) == 'table' and properties.delivery_tag
    if type(tag) ~= 'string' or tag == '' then
      return {KEYS[i], message, 0}
    end
    local info = type(properties.delivery_info) == 'table' and properties.delivery_info or {}
    local exchange = type(info.exchange) == 'string' and info.exchange or ''
    local routing_key = type(info.routing_key) == 'string' and info.routing_key or ''
    redis.call('ZADD', KEYS[1], ARGV[1], tag)
    -- The message is embedded as stored: re-encoding it could change numbers cjson cannot represent exactly.
    redis.call('HSET', KEYS[2], tag,
      '[' .. message .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(routing_key) .. ']')
    return {KEYS[i], message, 1}
  end
end
return nil
