-- rate: admit one request to an endpoint under its fleet-wide limits, or say how long to wait
-- (GCRA, one "theoretical arrival time" per limit; a request is admitted once every limit's
-- time has come and the server's last Retry-After has passed, and moves each time forward by
-- its cost: 1 request, its tokens).
-- KEYS[1] = rate_key(endpoint)   hash: 'req', 'tok' = theoretical arrival times (ms),
--           'hold' = no request before this time (ms; a Retry-After heard by any worker)
-- ARGV[1] = requests per minute ('' = unlimited)   ARGV[2] = tokens per minute ('' = unlimited)
-- ARGV[3] = 'take': the request's tokens (estimated before it is sent)
--           'adjust': tokens to move the token time by (may be negative: it used fewer)
--           'pause': milliseconds from now before any request
-- ARGV[4] = 'take' | 'adjust' | 'pause'
-- Returns: 0 when admitted (or adjusted, or paused), else milliseconds to wait (nothing
-- written).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, tpm, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local keep = 180000
if ARGV[4] == 'pause' then
  local hold = tonumber(redis.call('HGET', KEYS[1], 'hold') or '0')
  redis.call('HSET', KEYS[1], 'hold', math.max(hold, now + cost))
  redis.call('PEXPIRE', KEYS[1], keep + cost)
  return 0
end
local tok = tonumber(redis.call('HGET', KEYS[1], 'tok') or '0')
if ARGV[4] == 'adjust' then
  if tpm then
    redis.call('HSET', KEYS[1], 'tok', math.max(tok, now) + cost * 60000 / tpm)
    redis.call('PEXPIRE', KEYS[1], keep)
  end
  return 0
end
local req = tonumber(redis.call('HGET', KEYS[1], 'req') or '0')
local hold = tonumber(redis.call('HGET', KEYS[1], 'hold') or '0')
local wait = math.max(0, hold - now)
if rpm and req > now then wait = math.max(wait, req - now) end
if tpm and tok > now then wait = math.max(wait, tok - now) end
if wait > 0 then return math.ceil(wait) end
if rpm then redis.call('HSET', KEYS[1], 'req', now + 60000 / rpm) end
if tpm then redis.call('HSET', KEYS[1], 'tok', now + cost * 60000 / tpm) end
if rpm or tpm then
  -- an idle endpoint's state expires: its times have all passed by then
  redis.call('PEXPIRE', KEYS[1], keep + math.ceil(cost * 60000 / (tpm or 1e9)))
end
return 0
