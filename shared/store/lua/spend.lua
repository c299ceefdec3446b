-- spend: the workers' token ledger. A request holds its worst case before it is sent, and is
-- charged when it returns (the hold let go in the same step): the usage it reported, or its
-- hold when it may have reached the server without an answer (a timeout, a lost connection, a
-- worker killed mid-try: the janitor charges a hold past its deadline). A charge never passes
-- a total: at most the hold, and a late one (its hold charged by the janitor first) nothing
-- more. Every step may be sent again (a reply lost to a dropped connection) and does nothing
-- the second time. The totals are the budgets' (read here, written by the gateway only).
-- KEYS[1] = HOLDS            hash: ticket -> JSON {tokens, mine, worker, dataset, split,
--           principal}, or 'charged' once it was (kept a minute more, for a retried charge)
-- KEYS[2] = HOLD_DEADLINES   zset: ticket -> deadline (ms, Redis's clock)
-- KEYS[3] = budget_key(dataset, split)             hash: 'tokens_total' (absent = unlimited)
-- KEYS[4] = spend_key(dataset, split)              hash: 'used', 'reserved'
-- KEYS[5], KEYS[6] = the same two for the run's principal on the split (absent: no principal;
--           charged only while that principal has a budget on the split, as runs and samples)
-- ARGV[1] = 'hold' | 'charge' | 'expire'    ARGV[2] = ticket
-- 'hold':   ARGV[3] = tokens   ARGV[4] = the JSON record of the hold   ARGV[5] = life (ms)
-- 'charge': ARGV[3] = tokens the request used
-- 'expire': nothing more (the janitor: the hold's worker died mid-try)
-- Returns: 'hold': {1} held, or {0, 'split' or 'principal', total, used, reserved} (nothing
-- written); 'charge' and 'expire': the tokens charged.
local op, ticket = ARGV[1], ARGV[2]
local KEEP_CHARGED = 60000
local function pairs_of(mine)
  local found = {{KEYS[3], KEYS[4], 'split'}}
  if mine then found[2] = {KEYS[5], KEYS[6], 'principal'} end
  return found
end
local function number(key, field)
  return tonumber(redis.call('HGET', key, field) or '0')
end
local held = redis.call('HGET', KEYS[1], ticket)
if op == 'hold' then
  if held then return {1} end -- sent again after its reply was lost
  local tokens = tonumber(ARGV[3])
  local mine = #KEYS >= 6 and redis.call('HEXISTS', KEYS[5], 'tokens_total') == 1
  for _, pair in ipairs(pairs_of(mine)) do
    local total = redis.call('HGET', pair[1], 'tokens_total')
    if total then
      local used, reserved = number(pair[2], 'used'), number(pair[2], 'reserved')
      if used + reserved + tokens > tonumber(total) then
        return {0, pair[3], tonumber(total), used, reserved}
      end
    end
  end
  for _, pair in ipairs(pairs_of(mine)) do redis.call('HINCRBY', pair[2], 'reserved', tokens) end
  local record = cjson.decode(ARGV[4])
  record.mine = mine and 1 or 0
  redis.call('HSET', KEYS[1], ticket, cjson.encode(record))
  redis.call('ZADD', KEYS[2], now() * 1000 + tonumber(ARGV[5]), ticket)
  return {1}
end
if held == 'charged' then -- charged before: by this worker (a retry) or by the janitor
  if op == 'expire' then
    redis.call('HDEL', KEYS[1], ticket)
    redis.call('ZREM', KEYS[2], ticket)
  end
  return 0
end
if not held then
  -- its hold is long gone (a charge later than the janitor's, and than KEEP_CHARGED): charge
  -- what is left, never past a total
  if op == 'expire' then
    redis.call('ZREM', KEYS[2], ticket)
    return 0
  end
  local mine = #KEYS >= 6 and redis.call('HEXISTS', KEYS[5], 'tokens_total') == 1
  local charge = tonumber(ARGV[3])
  for _, pair in ipairs(pairs_of(mine)) do
    local total = redis.call('HGET', pair[1], 'tokens_total')
    if total then
      local left = tonumber(total) - number(pair[2], 'used') - number(pair[2], 'reserved')
      charge = math.max(0, math.min(charge, left))
    end
  end
  for _, pair in ipairs(pairs_of(mine)) do redis.call('HINCRBY', pair[2], 'used', charge) end
  return charge
end
local record = cjson.decode(held)
local tokens = tonumber(record.tokens)
local charge = tokens
if op == 'charge' then charge = math.min(tonumber(ARGV[3]), tokens) end
for _, pair in ipairs(pairs_of(record.mine == 1)) do
  redis.call('HSET', pair[2], 'reserved', math.max(0, number(pair[2], 'reserved') - tokens))
  redis.call('HINCRBY', pair[2], 'used', charge)
end
redis.call('HSET', KEYS[1], ticket, 'charged')
redis.call('ZADD', KEYS[2], now() * 1000 + KEEP_CHARGED, ticket)
return charge
