-- finish: store a run's aggregate and end it, unless it has ended already.
-- KEYS[1] = RunKeys.meta       hash: status, finished, reason
-- KEYS[2] = RunKeys.aggregate  string, the aggregate metrics JSON
-- KEYS[3] = RunKeys.stats      string, each metric's mean, stderr and 95% interval (JSON)
-- KEYS[4] = UNSENT             set: runs whose unsent samples the gateway gives back
-- KEYS[5..8] = RunKeys.attempts_of(INFER), .attempts_of(SCORE), .deliveries_of(INFER) and
--           .deliveries_of(SCORE)   hashes, deleted: an ended run attempts nothing more
-- ARGV[1] = 'completed' or 'failed'   ARGV[2] = aggregate JSON   ARGV[3] = reason ('' = none)
-- ARGV[4] = stats JSON ('' = none)    ARGV[5] = the run's id when a token budget kept some of its
--           samples from being sent ('' = none did)
-- Returns: 1 if this call ended the run, 0 if it had ended (completed, failed or cancelled).
local status = redis.call('HGET', KEYS[1], 'status')
if not going(status) then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], ARGV[4]) end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'finished', string.format('%.6f', now()))
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[3]) end
if ARGV[5] ~= '' then redis.call('SADD', KEYS[4], ARGV[5]) end
redis.call('DEL', KEYS[5], KEYS[6], KEYS[7], KEYS[8])
return 1
