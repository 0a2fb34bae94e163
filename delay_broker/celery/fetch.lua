-- fetch.lua: take the next tasks from kombu's Redis queue lists and record them as unacknowledged, in one step.
-- kombu pops with BRPOP and writes its unacked record only once the reply is parsed: a worker killed in
-- between loses the task. Here a task is never out of its list without its record, which kombu's
-- visibility_timeout restores from.
-- KEYS[1]   kombu's unacked index: ZSET delivery tag -> fetched at (seconds)
-- KEYS[2]   kombu's unacked hash: HASH delivery tag -> JSON [message, exchange, routing key]
-- KEYS[3..] queue lists, in the order BRPOP would take from them (priority, then queue)
-- ARGV[1]   now, in seconds, on the worker's clock (kombu's restore compares the index with its own clock)
-- ARGV[2]   at most this many tasks (what the worker has room for)
-- ARGV[3..] one flag per queue list: '1' record its tasks, '0' do not (a no_ack consumer never acknowledges)
-- Returns {list key, message, recorded (1 or 0)} for each task taken, in order (empty when every list is).
-- A message without a delivery tag (not published by kombu) is handed over unrecorded, as kombu would.

-- kombu writes a message's properties last, and delivery_tag last in them (kombu.transport.virtual's
-- _inplace_augment_message): a message ending this way names its tag and routing without a JSON decode, which
-- was a third of the script's time. A string with a quote or an escape in it, or any other layout, is decoded.
local KOMBU_TAIL = '^"delivery_info": {"exchange": "([^"\\]*)", "routing_key": "([^"\\]*)"}, "priority": %d+, '
  .. '"body_encoding": "%w*", "delivery_tag": "([^"\\]+)"}}$'
local TAIL_SEARCH = 512

local function routing(message)
  local at = string.find(message, '"delivery_info": {', math.max(1, #message - TAIL_SEARCH), true)
  if at then
    local exchange, routing_key, tag = string.match(message, KOMBU_TAIL, at)
    if tag then
      return tag, '"' .. exchange .. '"', '"' .. routing_key .. '"'
    end
  end
  local ok, decoded = pcall(cjson.decode, message)
  local properties = ok and type(decoded) == 'table' and decoded.properties
  local tag = type(properties) == 'table' and properties.delivery_tag
  if type(tag) ~= 'string' or tag == '' then
    return nil
  end
  local info = type(properties.delivery_info) == 'table' and properties.delivery_info or {}
  local exchange = type(info.exchange) == 'string' and info.exchange or ''
  local routing_key = type(info.routing_key) == 'string' and info.routing_key or ''
  return tag, cjson.encode(exchange), cjson.encode(routing_key)
end

local function record(message)
  local tag, exchange, routing_key = routing(message)
  if not tag then
    return 0
  end
  redis.call('ZADD', KEYS[1], ARGV[1], tag)
  -- The message is embedded as stored: re-encoding it could change numbers cjson cannot represent exactly.
  redis.call('HSET', KEYS[2], tag, '[' .. message .. ',' .. exchange .. ',' .. routing_key .. ']')
  return 1
end

local limit = tonumber(ARGV[2])
local taken = {}
for i = 3, #KEYS do
  while #taken < 3 * limit do
    local message = redis.call('RPOP', KEYS[i])
    if not message then
      break
    end
    local recorded = 0
    if ARGV[i] == '1' then
      recorded = record(message)
    end
    taken[#taken + 1] = KEYS[i]
    taken[#taken + 1] = message
    taken[#taken + 1] = recorded
  end
end
return taken
