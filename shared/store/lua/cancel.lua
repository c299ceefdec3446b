-- cancel: stop a run (no result is written after this) and count the samples without result.
-- KEYS[1] = RunKeys.meta   hash: status, finished (Redis's clock)
-- KEYS[2] = RunKeys.inferred bitmap: samples with an output
-- KEYS[3] = RunKeys.done   bitmap: samples settled (a score or a terminal error)
-- KEYS[4] = RunKeys.backlog list, messages not handed to the broker yet: deleted (the
--           dispatcher drops the run from its round when it next meets the empty backlog)
-- KEYS[5] = RunKeys.scratch: their union is counted there, and deleted
-- KEYS[6] = RunKeys.facts hash: reads 'n' (the gateway's count, not the workers') and
--           'ended' (a producer saw the run end: it is finished, whatever its state says)
-- ARGV: none
-- Returns: {state, unproduced}. state: 1 cancelled by this call, 0 cancelled before,
-- -1 the run had already finished (nothing changes). unproduced: samples with neither an
-- output nor an error; stable once the run is cancelled, since writes then stop.
local status = redis.call('HGET', KEYS[1], 'status')
if status == STATUS.COMPLETED or status == STATUS.FAILED or redis.call('HEXISTS', KEYS[6], 'ended') == 1 then
  return {-1, 0}
end
local state = 0
if status ~= STATUS.CANCELLED then
  redis.call('HSET', KEYS[1], 'status', STATUS.CANCELLED, 'finished', string.format('%.6f', now()))
  state = 1
end
redis.call('DEL', KEYS[4])
redis.call('BITOP', 'OR', KEYS[5], KEYS[2], KEYS[3])
local produced = redis.call('BITCOUNT', KEYS[5])
redis.call('DEL', KEYS[5])
local n = tonumber(redis.call('HGET', KEYS[6], 'n') or '0')
return {state, math.max(0, n - produced)}
