-- reserve: charge one run and its samples to a split's budget, all or nothing, and audit it.
-- KEYS[1] = evalq:budget:{dataset}:{split}  hash: runs_total, samples_total,
--           max_samples_per_run (absent = unlimited), runs_used, samples_used
-- KEYS[2] = evalq:audit                     stream
-- ARGV[1] = samples asked for   ARGV[2] = run id   ARGV[3] = principal
-- ARGV[4] = dataset             ARGV[5] = split    ARGV[6] = unix time
-- Checks, in order: runs left, samples left, per-run cap. A refusal writes nothing.
-- Returns: 'ok', or the limit that refused: 'runs', 'samples' or 'max_samples_per_run'.
local function field(name)
  local value = redis.call('HGET', KEYS[1], name)
  if value then return tonumber(value) end
  return nil
end
local samples = tonumber(ARGV[1])
local runs_total, samples_total = field('runs_total'), field('samples_total')
local cap = field('max_samples_per_run')
local runs_used, samples_used = field('runs_used') or 0, field('samples_used') or 0
if runs_total and runs_used + 1 > runs_total then return 'runs' end
if samples_total and samples_used + samples > samples_total then return 'samples' end
if cap and samples > cap then return 'max_samples_per_run' end
redis.call('HSET', KEYS[1], 'dataset', ARGV[4], 'split', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'runs_used', 1)
redis.call('HINCRBY', KEYS[1], 'samples_used', samples)
redis.call('XADD', KEYS[2], '*', 'action', 'reserve', 'who', ARGV[3], 'dataset', ARGV[4],
  'split', ARGV[5], 'run', ARGV[2], 'runs', 1, 'samples', samples, 'at', ARGV[6],
  'before', cjson.encode({runs_used = runs_used, samples_used = samples_used}),
  'after', cjson.encode({runs_used = runs_used + 1, samples_used = samples_used + samples}))
return 'ok'
