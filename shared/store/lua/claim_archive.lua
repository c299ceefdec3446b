-- claim_archive: decide who sends an ended run to be archived, so that one attempt at a time
-- is sent.
-- KEYS[1] = RunKeys.meta   hash: reads 'status'; 'archiving' = when an attempt was sent
-- ARGV[1] = seconds after which an attempt sent and not sealed may be sent again ('' = never:
--           only the first caller sends); times are Redis's clock
-- Returns: 1 the caller must send it (now stamped), 0 not (sent lately, or no such run: a
-- purged run's record is never recreated here).
if redis.call('HEXISTS', KEYS[1], 'status') == 0 then return 0 end
local sent = tonumber(redis.call('HGET', KEYS[1], 'archiving') or '')
local at = now()
if sent and (ARGV[1] == '' or at - sent < tonumber(ARGV[1])) then return 0 end
redis.call('HSET', KEYS[1], 'archiving', string.format('%.6f', at))
return 1
