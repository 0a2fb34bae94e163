-- envelope.lua: reading an envelope's header as delay_broker/envelope.py writes it (versions 1 and 2), so that
-- the exactly-once promotion routes messages without knowing any framework.
-- KEYS: none.
-- ARGV: none.

local find, sub, byte, decode = string.find, string.sub, string.byte, cjson.decode


local TRUNCATED = 'malformed envelope: truncated header'

-- The canonical text of the 16-byte UUID at `at`. bit.tohex of a group costs a fifth of one string.format of
-- sixteen bytes, which made the binary header slower to read than the JSON one; the first and last eight digits
-- as one 32-bit group each (tohex takes the low 32 bits of a larger number) make six calls, not eight: a
-- promotion reads one per message.
local function uuid_text(envelope, at)
    local a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p = byte(envelope, at, at + 15)
    local hex = bit.tohex
    return hex(((a * 256 + b) * 256 + c) * 256 + d, 8) .. '-' .. hex(e * 256 + f, 4) .. '-' .. hex(g * 256 + h, 4)
        .. '-' .. hex(i * 256 + j, 4) .. '-' .. hex(k * 256 + l, 4) .. hex(((m * 256 + n) * 256 + o) * 256 + p, 8)
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
