-- refund: give back part of a run's charge, at most once per run, never below zero used; the
-- submitter's own budget on the split, when one is set, gets the same back.
-- KEYS[1] = budget_key(dataset, split)              hash: runs_used, samples_used
-- KEYS[2] = budget_key(dataset, split, submitter)   the same, for one caller (if it exists)
-- KEYS[3] = AUDIT                                   stream
-- KEYS[4] = RunKeys.facts   hash: 'refunded' set once (HSETNX): idempotency, where no worker
--           can write (nothing is given back for a run without facts)
-- ARGV[1] = runs to give back   ARGV[2] = samples to give back   ARGV[3] = who gives it back
-- ARGV[4] = dataset   ARGV[5] = split   ARGV[6] = run id   ARGV[7] = unix time   ARGV[8] = reason
-- Returns: the number of samples given back to the split (0 when this run was refunded before).
if redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
if redis.call('HSETNX', KEYS[4], 'refunded', ARGV[8]) == 0 then return 0 end
local function give_back(key)
  local runs_used = tonumber(redis.call('HGET', key, 'runs_used') or '0')
  local samples_used = tonumber(redis.call('HGET', key, 'samples_used') or '0')
  local runs = math.min(tonumber(ARGV[1]), runs_used)
  local samples = math.min(tonumber(ARGV[2]), samples_used)
  redis.call('HSET', key, 'runs_used', runs_used - runs, 'samples_used', samples_used - samples)
  return runs, samples, runs_used, samples_used
end
if redis.call('EXISTS', KEYS[2]) == 1 then give_back(KEYS[2]) end
local runs, samples, runs_used, samples_used = give_back(KEYS[1])
redis.call('XADD', KEYS[3], '*', 'action', 'refund', 'who', ARGV[3], 'dataset', ARGV[4],
  'split', ARGV[5], 'run', ARGV[6], 'runs', runs, 'samples', samples, 'at', ARGV[7],
  'reason', ARGV[8],
  'before', cjson.encode({runs_used = runs_used, samples_used = samples_used}),
  'after', cjson.encode({runs_used = runs_used - runs, samples_used = samples_used - samples}))
return samples
