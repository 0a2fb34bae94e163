-- _lib.lua: helpers shared by every script. delay_broker.scripts prepends this file to each script before
-- loading it, because Redis scripts cannot import one another.
-- KEYS: none of its own (each function takes the key names it touches from the calling script's KEYS).
-- ARGV: none.

-- Scores are due_ms * FIFO_SLOTS + slot: messages due in the same millisecond keep the order they were parked
-- in (see fifo_score). Must equal delay_broker.clock.FIFO_SLOTS.
local FIFO_SLOTS = 1024

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function due_of(score)
    return math.floor(tonumber(score) / FIFO_SLOTS)
end

-- Highest score that is due at `ms` (every slot of that millisecond).
local function due_limit(ms)
    return ms * FIFO_SLOTS + FIFO_SLOTS - 1
end

-- Milliseconds as seconds for error messages: whole seconds without a fraction, else to the millisecond.
local function seconds_text(ms)
    if ms % 1000 == 0 then
        return string.format('%d s', ms / 1000)
    end
    return string.format('%.3f s', ms / 1000)
end

-- The refusal of a due time further from now than the store's max_delay; the text after 'delay_broker: '
-- becomes the InvalidDelay users see, so it names the limit.
local function too_far(id, delay_ms, max_delay_ms)
    return redis.error_reply('ERR delay_broker: due time of ' .. id .. ' is ' .. seconds_text(delay_ms)
        .. ' from now, beyond max_delay (' .. seconds_text(max_delay_ms) .. ')')
end

-- The score of a message due at `due_ms` that goes after every message already due in that millisecond: the
-- slot after the last one taken. Per millisecond, not from a store-wide counter, whose wrap-around would put a
-- later park first. Past the last slot, messages share it and Redis orders them by id.
local function fifo_score(due_key, due_ms)
    local first = due_ms * FIFO_SLOTS
    local last = first + FIFO_SLOTS - 1
    local taken = redis.call('ZRANGE', due_key, last, first, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
    if taken[2] then
        return math.min(tonumber(taken[2]) + 1, last)
    end
    return first
end

local function dead_letter(dead_key, errors_key, stats_key, id, reason, now)
    redis.call('ZADD', dead_key, now, id)
    redis.call('HSET', errors_key, id, reason)
    redis.call('HINCRBY', stats_key, 'dead_lettered', 1)
end

-- Earliest due time (ms) in a due ZSET, or false.
local function head_due(due_key)
    local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
    if head[2] then
        return due_of(head[2])
    end
    return false
end

-- How many messages are due at `now`, at most `batch` (counted first so the head is taken with ZPOPMIN,
-- without passing every id back to ZREM).
local function count_due(due_key, now, batch)
    return math.min(batch, redis.call('ZCOUNT', due_key, '-inf', due_limit(now)))
end

-- Takes the `count` earliest members; returns their ids and the ZPOPMIN reply {id, score, id, score, ...}.
local function pop_due(due_key, count)
    local popped = redis.call('ZPOPMIN', due_key, count)
    local ids = {}
    for i = 1, #popped, 2 do
        ids[#ids + 1] = popped[i]
    end
    return ids, popped
end

-- Wake one sleeping promoter. The token is the wake list's own name, which tells a promoter of a sharded
-- namespace which shard to look at (tokens of other shards are relayed to shard 0's list by the store); one
-- token per shard is enough: whoever takes it re-reads that shard's head for everyone.
local function wake_one(wake_key)
    redis.call('LREM', wake_key, 0, wake_key)
    redis.call('LPUSH', wake_key, wake_key)
end

local find, sub, byte, decode = string.find, string.sub, string.byte, cjson.decode
local TRUNCATED = 'malformed envelope: truncated header'

-- The canonical text of the 16-byte UUID at `at`. bit.tohex of each 16-bit group costs a fifth of one
-- string.format of sixteen bytes, which made the binary header slower to read than the JSON one.
local function uuid_text(envelope, at)
    local a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p = byte(envelope, at, at + 15)
    local hex = bit.tohex
    return hex(a * 256 + b, 4) .. hex(c * 256 + d, 4) .. '-' .. hex(e * 256 + f, 4) .. '-' .. hex(g * 256 + h, 4)
        .. '-' .. hex(i * 256 + j, 4) .. '-' .. hex(k * 256 + l, 4) .. hex(m * 256 + n, 4) .. hex(o * 256 + p, 4)
end

-- Whether `text` is UTF-8 as Python's strict decoder has it (no overlong forms, surrogates or code points
-- past U+10FFFF), so that a record both readers see alike. ASCII, the usual case, costs one find.
local function is_utf8(text)
    if not find(text, '[\128-\255]') then
        return true
    end
    local i, size = 1, #text
    while i <= size do
        local c = byte(text, i)
        local extra, low, high = 0, 0x80, 0xBF
        if c >= 0xC2 and c <= 0xDF then
            extra = 1
        elseif c >= 0xE0 and c <= 0xEF then
            extra = 2
            low = c == 0xE0 and 0xA0 or 0x80
            high = c == 0xED and 0x9F or 0xBF
        elseif c >= 0xF0 and c <= 0xF4 then
            extra = 3
            low = c == 0xF0 and 0x90 or 0x80
            high = c == 0xF4 and 0x8F or 0xBF
        elseif c >= 0x80 then
            return false
        end
        if i + extra > size then
            return false
        end
        for k = 1, extra do
            local b = byte(text, i + k)
            if b < (k == 1 and low or 0x80) or b > (k == 1 and high or 0xBF) then
                return false
            end
        end
        i = i + extra + 1
    end
    return true
end

-- The text of a field at `at` (a u16 length, then the bytes) and the position after it, or nil when the
-- envelope ends first. A plain function, not a closure: it runs for every message of a batch.
local function field_text(envelope, at, size)
    local high, low = byte(envelope, at, at + 1)
    local stop = low and at + 1 + high * 256 + low
    if not stop or stop > size then
        return nil, at
    end
    return sub(envelope, at + 2, stop), stop + 1
end

-- A version 2 (binary) header; see delay_broker/envelope.py for the layout. Returns the header table (without
-- the framework), the payload, or nil and a reason.
local function open_binary(envelope)
    local size = #envelope
    if size < 9 then
        return nil, nil, TRUNCATED
    end
    local flags = byte(envelope, 2)
    if flags >= 16 then  -- bits of a later format: its fields cannot be found, nor the payload
        return nil, nil, string.format('malformed envelope: unknown flags 0x%02x', flags)
    end
    -- The framework is skipped, not read: no script uses it, and a string per message costs a batch.
    local route, at = field_text(envelope, 10 + byte(envelope, 9), size)
    if not route then
        return nil, nil, TRUNCATED
    end
    local header = {v = 2, r = route}
    if flags % 2 == 1 then
        header.n, at = field_text(envelope, at, size)
        if not header.n then
            return nil, nil, TRUNCATED
        end
    end
    if bit.band(flags, 2) ~= 0 then
        if bit.band(flags, 4) ~= 0 then
            if at + 15 > size then
                return nil, nil, TRUNCATED
            end
            header.h = uuid_text(envelope, at)
            at = at + 16
        else
            header.h, at = field_text(envelope, at, size)
            if not header.h then
                return nil, nil, TRUNCATED
            elseif not is_utf8(header.h) then
                return nil, nil, 'malformed envelope: hash field is not UTF-8'
            end
        end
    end
    if bit.band(flags, 8) ~= 0 then
        local a, b, c, d = byte(envelope, at, at + 3)
        local length = d and ((a * 256 + b) * 256 + c) * 256 + d
        if not length or at + 3 + length > size then
            return nil, nil, TRUNCATED
        end
        -- An object, not an array: cjson decodes both to a table, an empty array like an empty object.
        local object = find(envelope, '^[ \t\n\r]*{', at + 4)
        local ok, extras = pcall(decode, sub(envelope, at + 4, at + 3 + length))
        if not object or not ok or type(extras) ~= 'table' or extras[1] ~= nil then
            return nil, nil, 'malformed envelope: extras are not a JSON object'
        end
        header.x = extras
        at = at + 4 + length
    end
    return header, sub(envelope, at), nil
end

-- What is wrong with a version 1 (JSON) header, as delay_broker.envelope refuses it, or nil. No value read
-- here goes through cjson.encode: it refuses NaN and infinities, and an error half-way through a promotion
-- would lose the messages already taken.
local function json_header_problem(header)
    local null = cjson.null
    if header.v ~= 1 then
        local v = header.v
        local shown = type(v) == 'number' and tostring(v) or type(v) == 'string' and string.format('%q', v)
            or (v == nil or v == null) and 'None' or type(v)
        return 'unsupported envelope version ' .. shown
    elseif type(header.r) ~= 'string' or header.r == '' then
        return 'malformed envelope: no route'
    elseif type(header.f) ~= 'string' then
        return 'malformed envelope: no framework'
    elseif header.n ~= nil and header.n ~= null and type(header.n) ~= 'string' then
        return 'malformed envelope: name is not a string'
    elseif header.h ~= nil and header.h ~= null and type(header.h) ~= 'string' then
        return 'malformed envelope: hash field is not a string'
    elseif header.x ~= nil and (type(header.x) ~= 'table' or header.x[1] ~= nil) then
        return 'malformed envelope: extras are not an object'
    elseif header.t ~= nil and (type(header.t) ~= 'number' or header.t % 1 ~= 0) then
        return 'malformed envelope: parked-at is not an integer'
    end
    return nil
end

-- Splits an envelope into its header table and payload; returns nil and a reason when malformed.
local function open_envelope(envelope)
    if byte(envelope, 1) == 2 then
        return open_binary(envelope)
    end
    local newline = find(envelope, '\n', 1, true)
    if not newline then
        return nil, nil, 'malformed envelope: no header line'
    end
    local ok, header = pcall(decode, sub(envelope, 1, newline - 1))
    if not ok or type(header) ~= 'table' or header[1] ~= nil then
        return nil, nil, 'malformed envelope: header is not a JSON object'
    end
    local problem = json_header_problem(header)
    if problem then
        return nil, nil, problem
    end
    return header, sub(envelope, newline + 1), nil
end

-- The envelope without its payload: listings show only the header, and a page of large messages would cost
-- Redis their whole size again in its reply. A corrupt envelope is given whole, to be shown as it is.
local function without_payload(envelope)
    if not envelope then
        return envelope
    end
    local header, payload = open_envelope(envelope)
    if not header then
        return envelope
    end
    return sub(envelope, 1, #envelope - #payload)
end

-- Checks, before anything is written, that each key holds the type this store expects (or does not exist).
-- Takes pairs: key, expected type ('zset', 'hash', 'list' or 'string'). Returns an error reply naming the
-- first key of the wrong type, or nil. A script that fails half-way keeps the writes it made before the
-- failure (Redis does not roll scripts back), so a WRONGTYPE after a ZPOPMIN would lose messages: every
-- writing script calls this first and refuses to run instead.
local function wrong_type(...)
    local spec = {...}
    for i = 1, #spec, 2 do
        local actual = redis.call('TYPE', spec[i])['ok']
        if actual ~= 'none' and actual ~= spec[i + 1] then
            return redis.error_reply('WRONGTYPE key ' .. spec[i] .. ' holds a ' .. actual .. ', expected a '
                .. spec[i + 1] .. ': nothing was changed; delete or rename the key to let delay_broker go on')
        end
    end
    return nil
end

-- An error reply naming the first command of SCRIPT_COMMANDS (generated by delay_broker.scripts from the
-- script's text) that the ACL user may not run, or nil. Redis checks each redis.call against the ACL only when
-- it runs, and a script refused half-way keeps its writes: a claim refused its HSET after its ZPOPMIN lost the
-- batch. Redis 6.2 has no redis.acl_check_cmd: there, nil (a least-privilege user must grant every command).
local function denied_command()
    if not redis.acl_check_cmd then
        return nil
    end
    for _, command in ipairs(SCRIPT_COMMANDS) do
        if not redis.acl_check_cmd(command) then
            return redis.error_reply('NOPERM the Redis user may not run ' .. command .. ', which this operation '
                .. 'needs: nothing was changed; grant it (+' .. string.lower(command) .. ')')
        end
    end
    return nil
end

-- Adds `count` to the stats counter `field`; returns nil, or the refusal to return: a key of the wrong type
-- named, a counter that is not an integer said so, any other refusal of the server's (OOM, NOREPLICAS,
-- READONLY) as Redis said it (redis.pcall's error table has the same shape on Redis 6.2 to 8). Made a
-- script's first write, so that a refusal leaves every message as it was.
local function count_first(stats_key, field, count)
    local reply = redis.pcall('HINCRBY', stats_key, field, count)
    if type(reply) ~= 'table' then
        return nil
    end
    local problem = wrong_type(stats_key, 'hash')
    if problem then
        return problem
    end
    if string.find(reply['err'], 'not an integer', 1, true) then
        return redis.error_reply('ERR field ' .. field .. ' of key ' .. stats_key .. ' is not an integer counter: '
            .. 'nothing was changed; delete the field to let delay_broker go on')
    end
    return reply
end

-- What a leased message goes back with: its due score (from LEASED; now if that is gone) and its failed
-- attempts so far; or nil, nil and the reason to dead-letter it when either is not a number, since giving it
-- back would fail half-way or loop. Reads only.
local function lease_record(leased_key, attempts_key, id, now)
    local leased = redis.call('HGET', leased_key, id)
    local score = now * FIFO_SLOTS
    if leased then
        score = tonumber(leased)
    end
    -- tonumber takes 'nan' and 'inf' too: ZADD refuses NaN, which failed the script after its deletes.
    if not score or score ~= score or score == math.huge or score == -math.huge then
        return nil, nil, 'malformed lease record: its due score is not a number'
    end
    local counted = redis.call('HGET', attempts_key, id)
    local attempts = 0
    if counted then
        attempts = tonumber(counted)
    end
    if not attempts or attempts < 0 or attempts ~= math.floor(attempts) then
        return nil, nil, 'malformed attempts count: not a whole number'
    end
    return score, attempts, nil
end

-- A promoter's heartbeat, written after the script's other writes. Over maxmemory Redis refuses a script's
-- first write if it may grow memory (ZADD): a promoter that pops and deletes first is what lets the store
-- drain, and one with nothing to do skips its heartbeat rather than fail. Any other refusal (a read-only
-- replica, too few replicas) is returned, for the script to return: it stops the first write as well, so
-- nothing was written before it.
local function heartbeat(promoters_key, now, promoter)
    local reply = redis.pcall('ZADD', promoters_key, now, promoter)
    if type(reply) == 'table' and reply['err'] and not string.find(reply['err'], 'OOM', 1, true) then
        return reply
    end
    return nil
end

-- Promotion lateness, store-wide and all time: how many messages were promoted how late (ms after their due
-- time), in buckets named by their upper edge ('10' = under 10 ms, ..., 'more'). Must equal
-- delay_broker.store.LATENESS_EDGES_MS.
local LATENESS_EDGES = {10, 100, 1000, 10000, 60000}

local function count_lateness(lateness_key, values)
    -- Counted per bucket position, named once at the end: a name per message made a string per message.
    local edges, buckets = LATENESS_EDGES, #LATENESS_EDGES
    local counts = {}
    for _, value in ipairs(values) do
        local bucket = buckets + 1
        for position = 1, buckets do
            if value < edges[position] then
                bucket = position
                break
            end
        end
        counts[bucket] = (counts[bucket] or 0) + 1
    end
    for bucket, count in pairs(counts) do
        redis.call('HINCRBY', lateness_key, bucket > buckets and 'more' or tostring(edges[bucket]), count)
    end
end

-- Packed records (see delay_broker/packing.py): the id's 16 bytes, the due time in 6 bytes (big-endian ms),
-- then the envelope as MSG holds it. A record taken out by id is cleared in place (an empty string), so that
-- the positions of the others stay what the packed index says.
local PACK_HEADER = 22

-- Entries past which a partition of the packed index asks for a split. Must equal
-- delay_broker.packing.SPLIT_AT.
local SPLIT_AT = 128

-- `n` (below 2^48) in 6 big-endian bytes.
local function u48_text(n)
    return struct.pack('>I2I4', math.floor(n / 4294967296), n % 4294967296)
end

-- The due time of a packed record, or nil when the record is too short to hold one.
local function packed_due(record)
    local a, b, c, d, e, f = string.byte(record, 17, 22)
    if not f then
        return nil
    end
    return ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end

-- A location as the packed index holds it (12 bytes: the pack's width and slot and the record's position, each
-- a big-endian u32): the pack's name ('width:slot'), the position, and the location as text
-- ('width:slot:position', as callers give and take it); nil for anything else.
local function parse_location(value)
    if not value or #value ~= 12 then
        return nil
    end
    local width, slot, position = struct.unpack('>I4I4I4', value)
    local name = width .. ':' .. slot
    return name, position, name .. ':' .. position
end

-- The index's 12 bytes for a record of pack `name` at `position`. struct.pack would wrap a number past 2^32
-- silently, and the entry would point at another pack (packing.pack_name keeps names within it).
local function location_value(name, position)
    local width, slot = string.match(name, '^(%d+):(%d+)$')
    width, slot = tonumber(width), tonumber(slot)
    if not width or width >= 4294967296 or slot >= 4294967296 or position >= 4294967296 then
        error('pack name or position out of range: ' .. tostring(name) .. ':' .. tostring(position))
    end
    return struct.pack('>I4I4I4', width, slot, position)
end

-- The record at a location, or false: the pack's head may have been taken already (PACK_BASE counts it).
local function packed_record(pack_key, base_key, name, position)
    local base = tonumber(redis.call('HGET', base_key, name) or '0') or 0
    if position < base then
        return false
    end
    return redis.call('LINDEX', pack_key, position - base)
end

-- The partition of the packed index a 16-byte id is in, for the shape 'level:split' (see
-- delay_broker/packing.py: its hash modulo 2^level, or modulo 2^(level + 1) below split).
local function index_partition(binary, level, split)
    local hashed = tonumber(string.sub(redis.sha1hex(binary), 1, 8), 16)
    local partition = hashed % 2 ^ level
    if partition < split then
        partition = hashed % 2 ^ (level + 1)
    end
    return partition
end

-- The packed index's shape as stored: its text ('0:0' when absent), level and split.
local function index_shape(shape_key)
    local text = redis.call('GET', shape_key) or '0:0'
    local level, split = string.match(text, '^(%d+):(%d+)$')
    return text, tonumber(level or 0), tonumber(split or 0)
end

-- Where each id of a by-id script is packed, checked against where the caller says (the scripts' last three
-- ARGV: the index shape the caller placed the ids by, the ids' 16-byte forms run together, 16 zero bytes for
-- an id never packed, and one location per id, space-separated, '-' for none). KEYS from first_key on hold,
-- every `stride` keys, an id's index partition and the pack the caller named. Returns a table by id position
-- of {pack key, name, position, record, partition key, 16-byte id} (false when not packed) and a list of
-- {partition key, 16-byte id} of index entries that point at no record of their id (left by a hand-made
-- change: no entry, for every reader, and a script that writes removes them). Or nil, nil and a refusal,
-- having read only: 'RESHAPED level:split' when the index was split so that an id is in another partition
-- than the one given, or 'PACKED n location ...' naming where the ids that are elsewhere are now; the caller
-- calls again with those.
local function pack_locate(count, first_key, stride, shape, binaries, expected, base_key, shape_key)
    local none = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
    local current, level, split = index_shape(shape_key)
    if current ~= shape then
        for position = 1, count do
            local binary = string.sub(binaries, position * 16 - 15, position * 16)
            local given = string.match(KEYS[first_key + (position - 1) * stride], ':packed:(%d+)$')
            if binary ~= none and tonumber(given) ~= index_partition(binary, level, split) then
                return nil, nil, redis.error_reply('RESHAPED ' .. current)
            end
        end
    end
    local found, stale, moved = {}, {}, {}
    local position = 0
    for location in string.gmatch(expected, '%S+') do
        position = position + 1
        found[position] = false
        local binary = string.sub(binaries, position * 16 - 15, position * 16)
        if position <= count and #binary == 16 and binary ~= none then
            local key = KEYS[first_key + (position - 1) * stride]
            local at = redis.call('HGET', key, binary)
            local name, offset, text = parse_location(at)
            if name and text ~= location then
                moved[#moved + 1] = position .. ' ' .. text
            elseif name then
                local pack = KEYS[first_key + (position - 1) * stride + 1]
                local record = packed_record(pack, base_key, name, offset)
                if record and string.sub(record, 1, 16) == binary then
                    found[position] = {pack, name, offset, record, key, binary}
                else
                    stale[#stale + 1] = {key, binary}
                end
            else
                if at then
                    stale[#stale + 1] = {key, binary}
                end
                if location ~= '-' then
                    moved[#moved + 1] = position .. ' -'
                end
            end
        end
    end
    if position ~= count then
        return nil, nil, redis.error_reply('ERR delay_broker: ' .. position .. ' packed locations for ' .. count
            .. ' ids')
    end
    if #moved > 0 then
        return nil, nil, redis.error_reply('PACKED ' .. table.concat(moved, ' '))
    end
    return found, stale, nil
end

-- Wakes a promoter when one of the packs `earlier` (a set of names whose earliest due time just went down) is
-- now the first to open. A promoter looks at packs on a timer set by its own pack_after: a producer with a
-- shorter one makes packs due before that timer ends. Called after the writes, so a WAKE of the wrong type
-- skips the wake (the timer still opens the pack) rather than failing a park that is done. Returns whether it
-- woke one.
local function wake_for_pack(packs_key, earlier, wake_key)
    if not earlier[redis.call('ZRANGE', packs_key, 0, 0)[1]] then
        return false
    end
    local kind = redis.call('TYPE', wake_key)['ok']
    if kind ~= 'list' and kind ~= 'none' then
        return false
    end
    wake_one(wake_key)
    return true
end

-- Appends a message to a pack: its record at the pack's tail, its entry in the index partition, the pack's
-- earliest due time and count. Returns whether the partition now holds more than SPLIT_AT entries (the
-- caller asks for a split), and whether the pack's earliest due time went down (the caller may wake a
-- promoter: wake_for_pack).
local function pack_append(partition, pack, name, binary, due, envelope, packs_key, base_key, live_key)
    local base = tonumber(redis.call('HGET', base_key, name) or '0') or 0
    local length = redis.call('RPUSH', pack, binary .. u48_text(due) .. envelope)
    redis.call('HSET', partition, binary, location_value(name, base + length - 1))
    local earlier = redis.call('ZADD', packs_key, 'LT', 'CH', due, name) == 1
    redis.call('HINCRBY', live_key, name, 1)
    return redis.call('HLEN', partition) > SPLIT_AT, earlier
end

-- Removes the index entries pack_locate found pointing at no record of their id.
local function drop_stale(stale)
    for _, entry in ipairs(stale) do
        redis.call('HDEL', entry[1], entry[2])
    end
end

-- Takes a located message (from pack_locate) out of its pack: its record is cleared, its index entry removed,
-- and a pack left with no message is dropped whole (then true is returned).
local function pack_take(place, packs_key, base_key, live_key)
    local pack, name, position = place[1], place[2], place[3]
    local base = tonumber(redis.call('HGET', base_key, name) or '0') or 0
    redis.call('LSET', pack, position - base, '')
    redis.call('HDEL', place[5], place[6])
    -- Exactly none left: a count spoiled by hand (below zero) must not drop records still packed.
    if redis.call('HINCRBY', live_key, name, -1) == 0 then
        redis.call('DEL', pack)
        redis.call('HDEL', base_key, name)
        redis.call('HDEL', live_key, name)
        redis.call('ZREM', packs_key, name)
        return true
    end
    return false
end

-- wrong_type for the packed index partitions (hashes) and packs (lists) a by-id script was given: `count`
-- ids, each with `stride` keys from first_key on, the first a partition and the others packs (or PACKS, a
-- placeholder checked on its own).
local function packed_keys_wrong_type(count, first_key, stride)
    local spec = {}
    for n = 1, count do
        local at = first_key + (n - 1) * stride
        spec[#spec + 1] = KEYS[at]
        spec[#spec + 1] = string.find(KEYS[at], ':packed:%d+$') and 'hash' or 'zset'
        for k = 1, stride - 1 do
            spec[#spec + 1] = KEYS[at + k]
            spec[#spec + 1] = string.find(KEYS[at + k], ':pack:%d+:%d+$') and 'list' or 'zset'
        end
    end
    return wrong_type(unpack(spec))
end
