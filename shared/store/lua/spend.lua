-- spend: the workers' token ledger. A request holds its worst case before it is sent, is
-- charged what it used when it returns (the hold let go in the same step), and a hold whose
-- worker is gone, or whose deadline passed, is released by the janitor. The totals are the
-- budgets' (read here, written by the gateway only).
-- KEYS[1] = HOLDS            hash: ticket -> JSON {tokens, host, since, dataset, split, principal}
-- KEYS[2] = HOLD_DEADLINES   zset: ticket -> deadline (ms, Redis's clock)
-- KEYS[3] = budget_key(dataset, split)             hash: 'tokens_total' (absent = unlimited)
-- KEYS[4] = spend_key(dataset, split)              hash: 'used', 'reserved'
-- KEYS[5], KEYS[6] = the same two for the run's principal on the split (absent: no principal)
-- ARGV[1] = 'hold' | 'charge' | 'release'    ARGV[2] = ticket
-- 'hold':    ARGV[3] = tokens   ARGV[4] = the JSON record of the hold   ARGV[5] = life (ms)
-- 'charge':  ARGV[3] = tokens the request used (0: it failed)
-- 'release': nothing more
-- Returns: 'hold': {1} held, or {0, 'split' or 'principal', total, used, reserved} (nothing
-- written); 'charge': 1; 'release': the tokens given back (0: no such hold).
local op, ticket = ARGV[1], ARGV[2]
local pairs_of = {{KEYS[3], KEYS[4], 'split'}}
if #KEYS >= 6 then pairs_of[2] = {KEYS[5], KEYS[6], 'principal'} end
local function let_go()
  local held = redis.call('HGET', KEYS[1], ticket)
  if not held then return 0 end
  local tokens = tonumber(cjson.decode(held).tokens)
  for _, pair in ipairs(pairs_of) do
    local reserved = tonumber(redis.call('HGET', pair[2], 'reserved') or '0')
    redis.call('HSET', pair[2], 'reserved', math.max(0, reserved - tokens))
  end
  redis.call('HDEL', KEYS[1], ticket)
  redis.call('ZREM', KEYS[2], ticket)
  return tokens
end
if op == 'hold' then
  local tokens = tonumber(ARGV[3])
  for _, pair in ipairs(pairs_of) do
    local total = redis.call('HGET', pair[1], 'tokens_total')
    if total then
      local used = tonumber(redis.call('HGET', pair[2], 'used') or '0')
      local reserved = tonumber(redis.call('HGET', pair[2], 'reserved') or '0')
      if used + reserved + tokens > tonumber(total) then
        return {0, pair[3], tonumber(total), used, reserved}
      end
    end
  end
  for _, pair in ipairs(pairs_of) do redis.call('HINCRBY', pair[2], 'reserved', tokens) end
  redis.call('HSET', KEYS[1], ticket, ARGV[4])
  redis.call('ZADD', KEYS[2], now() * 1000 + tonumber(ARGV[5]), ticket)
  return {1}
end
if op == 'charge' then
  let_go()
  local used = tonumber(ARGV[3])
  if used > 0 then
    for _, pair in ipairs(pairs_of) do redis.call('HINCRBY', pair[2], 'used', used) end
  end
  return 1
end
return let_go()
