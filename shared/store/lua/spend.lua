-- spend: the workers' token ledger. A request holds its worst case before it is sent, and is
-- charged when it returns (the hold let go in the same step): the usage it reported, or its
-- hold when it may have reached the server without an answer (a timeout, a lost connection, a
-- worker killed mid-try: the janitor charges a hold past its deadline). A charge never passes
-- a total: at most the hold, and a late one (its hold charged by the janitor first) nothing
-- more. Every step may be sent again (a reply lost to a dropped connection) and does nothing
-- the second time.
-- The totals are the budgets' (``tokens_total`` in evalq:budget:*, written by the gateway
-- only): the caller reads them just before the call and passes them here (ARGV), since the
-- worker's ACL user may only read the budgets and Redis's ACL asks for write access to every
-- key of an EVALSHA. A total changed between that read and this script (``budget set``,
-- ``policy apply``) is judged as it was read, as if this step had run just before the change:
-- a total lowered meanwhile may be passed by this one step's tokens, as it may by the holds
-- made before the change (a change never takes back what is held), and the next step reads
-- the new total. Nothing else is read outside the script: 'used' and 'reserved' are read and
-- written here, atomically, so racing steps never take a budget past the total they were
-- given.
-- KEYS[1] = HOLDS            hash: ticket -> JSON {tokens, mine, shared, worker, dataset,
--           split, principal}, or 'charged' once it was (kept a minute more, for a retried
--           charge)
-- KEYS[2] = HOLD_DEADLINES   zset: ticket -> deadline (ms, Redis's clock)
-- KEYS[3] = spend_key(dataset, split)   hash: 'used', 'reserved'; 'held:<principal>' (what
--           each principal's requests hold on the split; absent at 0) and 'holders' (how many
--           principals hold anything there)
-- KEYS[4] = spend_key(dataset, split, principal)   hash: 'used', 'reserved' (absent: no
--           principal; charged only while that principal has a token budget on the split, as
--           runs and samples)
-- ARGV[1] = 'hold' | 'charge' | 'expire'    ARGV[2] = ticket
-- ARGV[3] = the split's tokens_total as read ('' = unlimited)
-- ARGV[4] = the principal's own tokens_total on the split as read ('' = it has none: its
--           own budget is not charged)
-- 'hold':   ARGV[5] = tokens   ARGV[6] = the JSON record of the hold   ARGV[7] = life (ms)
--           ARGV[8] = the principal ('' for none)
-- 'charge': ARGV[5] = tokens the request used
-- 'expire': nothing more (the janitor: the hold's worker died mid-try)
-- The fair share: on a split with a total, a principal that already holds tokens there may
-- hold more only while all it holds stays within (total - used) / (holders + 1), where
-- holders counts the principals holding (it among them): one principal alone holds at most
-- half of what is left, and a principal that arrives finds a part free that no one else may
-- take. A principal that holds nothing may always hold one request's worst case that fits
-- the total (else a request bigger than a share would never be sent).
-- Returns: 'hold': {1} held, or {0, 'split', 'principal' or 'share', total, used, reserved}
-- (nothing written; for 'share' the split's); 'charge' and 'expire': the tokens charged.
local op, ticket = ARGV[1], ARGV[2]
local KEEP_CHARGED = 60000
local totals = {tonumber(ARGV[3]), tonumber(ARGV[4])}
local function pairs_of(mine)
  local found = {{totals[1], KEYS[3], 'split'}}
  if mine then found[2] = {totals[2], KEYS[4], 'principal'} end
  return found
end
local function number(key, field)
  return tonumber(redis.call('HGET', key, field) or '0')
end
local function share_held(principal, tokens)
  -- what `principal` holds on the split moves by `tokens`; 'holders' counts those above 0
  local field = 'held:' .. principal
  local before = number(KEYS[3], field)
  local after = math.max(0, before + tokens)
  if after > 0 then redis.call('HSET', KEYS[3], field, after) else redis.call('HDEL', KEYS[3], field) end
  if before == 0 and after > 0 then redis.call('HINCRBY', KEYS[3], 'holders', 1) end
  if before > 0 and after == 0 then
    if number(KEYS[3], 'holders') <= 1 then redis.call('HDEL', KEYS[3], 'holders')
    else redis.call('HINCRBY', KEYS[3], 'holders', -1) end
  end
end
local mine = #KEYS >= 4 and totals[2] ~= nil
local held = redis.call('HGET', KEYS[1], ticket)
if op == 'hold' then
  if held then return {1} end -- sent again after its reply was lost
  local tokens, principal = tonumber(ARGV[5]), ARGV[8]
  for _, pair in ipairs(pairs_of(mine)) do
    local total = pair[1]
    if total then
      local used, reserved = number(pair[2], 'used'), number(pair[2], 'reserved')
      if used + reserved + tokens > total then
        return {0, pair[3], total, used, reserved}
      end
    end
  end
  if totals[1] then
    local mine_held = number(KEYS[3], 'held:' .. principal)
    if mine_held > 0 then
      local used = number(KEYS[3], 'used')
      local share = math.floor((totals[1] - used) / (number(KEYS[3], 'holders') + 1))
      if mine_held + tokens > share then
        return {0, 'share', totals[1], used, number(KEYS[3], 'reserved')}
      end
    end
  end
  for _, pair in ipairs(pairs_of(mine)) do redis.call('HINCRBY', pair[2], 'reserved', tokens) end
  share_held(principal, tokens)
  local record = cjson.decode(ARGV[6])
  record.mine = mine and 1 or 0
  record.shared = 1
  redis.call('HSET', KEYS[1], ticket, cjson.encode(record))
  redis.call('ZADD', KEYS[2], now() * 1000 + tonumber(ARGV[7]), ticket)
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
  local charge = tonumber(ARGV[5])
  for _, pair in ipairs(pairs_of(mine)) do
    local total = pair[1]
    if total then
      local left = total - number(pair[2], 'used') - number(pair[2], 'reserved')
      charge = math.max(0, math.min(charge, left))
    end
  end
  for _, pair in ipairs(pairs_of(mine)) do redis.call('HINCRBY', pair[2], 'used', charge) end
  return charge
end
local record = cjson.decode(held)
local tokens = tonumber(record.tokens)
local charge = tokens
if op == 'charge' then charge = math.min(tonumber(ARGV[5]), tokens) end
for _, pair in ipairs(pairs_of(record.mine == 1)) do
  redis.call('HSET', pair[2], 'reserved', math.max(0, number(pair[2], 'reserved') - tokens))
  redis.call('HINCRBY', pair[2], 'used', charge)
end
if record.shared == 1 then share_held(record.principal or '', -tokens) end
redis.call('HSET', KEYS[1], ticket, 'charged')
redis.call('ZADD', KEYS[2], now() * 1000 + KEEP_CHARGED, ticket)
return charge
