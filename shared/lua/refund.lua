-- refund: give back part of a run's charge, at most once per run, never below zero used.
-- KEYS[1] = evalq:budget:{dataset}:{split}  hash: runs_used, samples_used
-- KEYS[2] = evalq:audit                     stream
-- KEYS[3] = evalq:{run}:refund              string, set once (SETNX): the idempotency key
-- ARGV[1] = runs to give back   ARGV[2] = samples to give back   ARGV[3] = principal
-- ARGV[4] = dataset   ARGV[5] = split   ARGV[6] = run id   ARGV[7] = unix time   ARGV[8] = reason
-- Returns: the number of samples given back (0 when this run was refunded before).
if redis.call('SET', KEYS[3], ARGV[8], 'NX') == false then return 0 end
local runs_used = tonumber(redis.call('HGET', KEYS[1], 'runs_used') or '0')
local samples_used = tonumber(redis.call('HGET', KEYS[1], 'samples_used') or '0')
local runs = math.min(tonumber(ARGV[1]), runs_used)
local samples = math.min(tonumber(ARGV[2]), samples_used)
redis.call('HSET', KEYS[1], 'runs_used', runs_used - runs, 'samples_used', samples_used - samples)
redis.call('XADD', KEYS[2], '*', 'action', 'refund', 'who', ARGV[3], 'dataset', ARGV[4],
  'split', ARGV[5], 'run', ARGV[6], 'runs', runs, 'samples', samples, 'at', ARGV[7],
  'reason', ARGV[8],
  'before', cjson.encode({runs_used = runs_used, samples_used = samples_used}),
  'after', cjson.encode({runs_used = runs_used - runs, samples_used = samples_used - samples}))
return samples
