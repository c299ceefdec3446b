-- prelude: helpers put in front of every evalq script (see shared/store/scripts.py), after the
-- table STATUS of the run statuses, generated from RunStatus (each spelled once, in Python).
-- KEYS, ARGV: none of its own; it touches only the keys its callers pass in.

-- Whether a run of ``status`` is going: queued or running (RunStatus.active); its samples may
-- still change.
local function going(status)
  return status == STATUS.QUEUED or status == STATUS.RUNNING
end

-- A run's first write of a result moves it from queued to running.
-- meta = the run's RunKeys.meta hash, status = its 'status' as the caller read it
local function mark_running(meta, status)
  if status == STATUS.QUEUED then redis.call('HSET', meta, 'status', STATUS.RUNNING) end
end

-- The Redis server's clock, in seconds with microseconds: one clock for every worker.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

-- Delete the fields listed in the table ``fields`` from each hash in the table ``hashes``, a
-- thousand at a time (unpack() has a stack limit).
local function hdel_all(hashes, fields)
  for from = 1, #fields, 1000 do
    local upto = math.min(from + 999, #fields)
    for _, key in ipairs(hashes) do redis.call('HDEL', key, unpack(fields, from, upto)) end
  end
end

-- Bulk reads and writes, so a script over a batch makes a few calls whatever the batch's size
-- (each redis.call costs more than the work it does on one field): ``fields`` a table of field
-- names, ``pairs`` a flat table field1, value1, ...; a thousand at a time (unpack() has a
-- stack limit).
-- The values of ``fields`` in the hash ``key``, in order (false where absent).
local function hmget_all(key, fields)
  local found = {}
  for from = 1, #fields, 1000 do
    local got = redis.call('HMGET', key, unpack(fields, from, math.min(from + 999, #fields)))
    for _, value in ipairs(got) do found[#found + 1] = value end
  end
  return found
end
-- Set the fields and values of ``pairs`` in the hash ``key``.
local function hset_all(key, pairs)
  for from = 1, #pairs, 1000 do
    redis.call('HSET', key, unpack(pairs, from, math.min(from + 999, #pairs)))
  end
end
-- One bit of the bitmap ``key`` at each of the positions ``ids``, 300 at a time: read
-- (``command`` BITFIELD_RO, ``value`` nil) or set to ``value`` (BITFIELD); the replies in order.
local function bitfield_all(command, key, ids, value)
  local replies = {}
  local op = value == nil and 'GET' or 'SET'
  for from = 1, #ids, 300 do
    local args = {}
    for i = from, math.min(from + 299, #ids) do
      args[#args + 1] = op
      args[#args + 1] = 'u1'
      args[#args + 1] = ids[i]
      if value ~= nil then args[#args + 1] = value end
    end
    for _, reply in ipairs(redis.call(command, key, unpack(args))) do
      replies[#replies + 1] = reply
    end
  end
  return replies
end
-- Set the bits ``first`` to ``last`` of the bitmap ``key``: their whole bytes with one
-- SETRANGE (per 64 KiB), the bits outside whole bytes appended to the table ``single``.
local function set_span(key, first, last, single)
  local from, upto = math.ceil(first / 8), math.floor((last + 1) / 8) - 1 -- whole bytes
  if from > upto then
    for bit = first, last do single[#single + 1] = bit end
    return
  end
  for bit = first, 8 * from - 1 do single[#single + 1] = bit end
  for start = from, upto, 65536 do
    local bytes = math.min(65536, upto - start + 1)
    redis.call('SETRANGE', key, start, string.rep('\255', bytes))
  end
  for bit = 8 * (upto + 1), last do single[#single + 1] = bit end
end
-- Set the bit of each of the sample ids ``ids`` in the bitmap ``key``: the whole bytes of a
-- run of consecutive ids (a segment's, usually) with one SETRANGE each, the other bits with
-- BITFIELD (bitfield_all).
local function set_bits(key, ids)
  local single, i = {}, 1
  while i <= #ids do
    local first = tonumber(ids[i])
    local last = first
    while i < #ids and tonumber(ids[i + 1]) == last + 1 do
      i = i + 1
      last = last + 1
    end
    set_span(key, first, last, single)
    i = i + 1
  end
  bitfield_all('BITFIELD', key, single, 1)
end
-- Set the bits ``first`` to ``last`` of the bitmap ``key``.
local function set_range(key, first, last)
  local single = {}
  set_span(key, first, last, single)
  bitfield_all('BITFIELD', key, single, 1)
end
-- The lowest and the highest of the sample ids ``ids`` (strings or numbers), as numbers.
local function bounds(ids)
  local low, high = math.huge, -1
  for _, id in ipairs(ids) do
    local n = tonumber(id)
    if n < low then low = n end
    if n > high then high = n end
  end
  return low, high
end
-- Which of the sample ids ``ids`` are set in the bitmap ``key`` (a run's spilled samples): a
-- table, true at the position of each set one. One BITCOUNT over their span answers for a
-- batch none of whose samples is spilled (the usual case); only otherwise are bits read.
local function bits_of(key, ids)
  local set = {}
  if #ids == 0 or redis.call('EXISTS', key) == 0 then return set end
  local low, high = bounds(ids)
  if redis.call('BITCOUNT', key, low, high, 'BIT') == 0 then return set end
  for i, bit in ipairs(bitfield_all('BITFIELD_RO', key, ids)) do set[i] = bit == 1 end
  return set
end
-- How many of the distinct sample ids ``ids`` are set in the bitmap ``key``: one BITCOUNT
-- when they are every id of their span (a segment of consecutive ids), else their bits read.
local function count_bits(key, ids)
  if #ids == 0 then return 0 end
  local low, high = bounds(ids)
  if high - low + 1 == #ids then return redis.call('BITCOUNT', key, low, high, 'BIT') end
  local count = 0
  for _, bit in ipairs(bitfield_all('BITFIELD_RO', key, ids)) do count = count + bit end
  return count
end
-- The ids ``lo`` to ``lo + n - 1``, as strings (a span's samples, as ARGV would give them).
local function span_ids(lo, n)
  local ids = {}
  for i = 0, n - 1 do ids[i + 1] = tostring(lo + i) end
  return ids
end
-- Write a span of samples (the texts of ``lo`` to ``hi``, every one, joined by newlines) to
-- the hash ``key`` as the field ``lo-hi``, listed in the sorted set ``ranges`` by ``lo``, and
-- set their bits in the bitmap ``bits``; only when none of them is set in ``bits`` or in
-- ``spilled`` (one BITCOUNT each): false, and nothing written, otherwise.
local function write_span(key, ranges, bits, spilled, lo, hi, texts)
  if redis.call('BITCOUNT', bits, lo, hi, 'BIT') > 0
    or redis.call('BITCOUNT', spilled, lo, hi, 'BIT') > 0 then
    return false
  end
  local field = lo .. '-' .. hi
  redis.call('HSET', key, field, texts)
  redis.call('ZADD', ranges, lo, field)
  set_range(bits, lo, hi)
  return true
end

-- Count one more attempt of each sample the messages from ARGV[at] on bring, at one stage
-- (attempt.lua's rule, for it and for record_outputs.lua; the run is going). attempts = the
-- stage's attempts hash, spilled = RunKeys.spilled, deliveries = the stage's deliveries hash.
-- ARGV[at..] = per message: its key, solo (1 or 0), n, then its n sample ids, or -n and lo
-- for the n samples lo, lo + 1, ...; or, when ``given`` is passed, per message its key, solo
-- and n only: its ids are the next n of ``given``, in order: a table of ids, or a number
-- ``lo`` for the span lo, lo + 1, ... of samples none of which is spilled. A span's ids are
-- made only when a count must be read or written.
-- Returns the counts in order, as attempt.lua does.
local function count_attempts(attempts, spilled, deliveries, at, given)
  local counts, taken = {}, 0
  local alone = redis.call('EXISTS', attempts) == 1 -- none counted alone: nothing to read
  local clean = type(given) == 'number' -- a span checked unspilled by the caller
  while at <= #ARGV do
    local key, solo, n = ARGV[at], ARGV[at + 1] == '1', tonumber(ARGV[at + 2])
    local ids, lo, spilt = {}, nil, {}
    if clean then
      lo, taken, at = given + taken, taken + n, at + 3
    elseif given then
      for i = taken + 1, taken + n do ids[#ids + 1] = given[i] end
      taken, at = taken + n, at + 3
    elseif n < 0 then
      n, lo, at = -n, tonumber(ARGV[at + 3]), at + 4
      if redis.call('BITCOUNT', spilled, lo, lo + n - 1, 'BIT') > 0 then
        ids, lo = span_ids(lo, n), nil
      end
    else
      for i = at + 3, at + 2 + n do ids[#ids + 1] = ARGV[i] end
      at = at + 3 + n
    end
    if not lo then spilt = bits_of(spilled, ids) end
    local delivered = 1
    if not solo then delivered = redis.call('HINCRBY', deliveries, key, 1) end
    if not alone and not solo and delivered == 1 and next(spilt) == nil then
      for _ = 1, n do counts[#counts + 1] = 1 end -- a first delivery: every sample's first try
    else
      if lo then ids = span_ids(lo, n) end
      local had = alone and hmget_all(attempts, ids) or {}
      local writes = {}
      for j, id in ipairs(ids) do
        local before = tonumber(had[j]) or 0
        local tried = math.max(before, delivered - 1)
        if spilt[j] then
          counts[#counts + 1] = 0
        elseif solo or tried == 0 then
          counts[#counts + 1] = tried + 1
          if solo then
            writes[#writes + 1] = id
            writes[#writes + 1] = tried + 1
          end
        else
          counts[#counts + 1] = -tried
          if tried > before then
            writes[#writes + 1] = id
            writes[#writes + 1] = tried
          end
        end
      end
      hset_all(attempts, writes)
    end
  end
  return counts
end
-- A run made progress: stamp its progress hash (``status`` and the janitor read it).
-- progress = the run's RunKeys.progress hash
local function touch(progress)
  redis.call('HSET', progress, 'touched', string.format('%.6f', now()))
end
