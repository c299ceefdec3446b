-- reserve: open a recorded (pending) run and charge it, in one step: charge one run and its
-- samples to a split's budget, and to the caller's own budget on that split when one is set,
-- all or nothing, audit it, and make the run's record permanent and listed. A producer killed
-- before this leaves a pending record that expires and no charge; after it, a run and its
-- charge (the janitor sends the work of a run that never got its messages).
-- KEYS[1] = budget_key(dataset, split)              hash: runs_total, samples_total,
--           max_samples_per_run (absent = unlimited), runs_used, samples_used
-- KEYS[2] = budget_key(dataset, split, principal)   the same, for one caller (if it exists)
-- KEYS[3] = AUDIT                                   stream
-- KEYS[4] = RunKeys.facts   hash: 'charged' set here      KEYS[5] = RunKeys.meta
-- KEYS[6] = RunKeys.ids     KEYS[7] = RUNS (zset)         KEYS[8] = ACTIVE (set)
-- ARGV[1] = samples asked for   ARGV[2] = run id   ARGV[3] = principal
-- ARGV[4] = dataset             ARGV[5] = split    ARGV[6] = the run's creation (Redis's clock)
-- ARGV[7] = '1': charge the budget; '0': an admin's run, opened without touching any budget
-- Checks, in order, the split's then the caller's: runs left, samples left, per-run cap. A
-- refusal writes nothing.
-- Returns: {'ok'}, {'gone'} (the pending record expired: nothing written), or {the limit that
-- refused: 'runs', 'samples' or 'max_samples_per_run', and 'split' or 'principal'}.
if redis.call('EXISTS', KEYS[4]) == 0 or redis.call('EXISTS', KEYS[6]) == 0 then
  return {'gone'}
end
-- Made again (its answer was lost with a master that failed over after a replica had it):
-- the run is charged already, once.
if redis.call('HGET', KEYS[4], 'charged') == 'True' then return {'ok'} end
local function open_run(charged)
  redis.call('HSET', KEYS[4], 'charged', charged)
  for i = 4, 6 do redis.call('PERSIST', KEYS[i]) end
  redis.call('ZADD', KEYS[7], ARGV[6], ARGV[2])
  redis.call('SADD', KEYS[8], ARGV[2])
end
if ARGV[7] == '0' then
  open_run('False')
  return {'ok'}
end
local samples = tonumber(ARGV[1])
local function field(key, name)
  local value = redis.call('HGET', key, name)
  if value then return tonumber(value) end
  return nil
end
local function refusal(key)
  local runs_total, samples_total = field(key, 'runs_total'), field(key, 'samples_total')
  local cap = field(key, 'max_samples_per_run')
  local runs_used, samples_used = field(key, 'runs_used') or 0, field(key, 'samples_used') or 0
  if runs_total and runs_used + 1 > runs_total then return 'runs' end
  if samples_total and samples_used + samples > samples_total then return 'samples' end
  if cap and samples > cap then return 'max_samples_per_run' end
  return nil
end
local mine = redis.call('EXISTS', KEYS[2]) == 1
local refused = refusal(KEYS[1])
if refused then return {refused, 'split'} end
if mine then
  refused = refusal(KEYS[2])
  if refused then return {refused, 'principal'} end
end
local runs_used, samples_used = field(KEYS[1], 'runs_used') or 0, field(KEYS[1], 'samples_used') or 0
redis.call('HSET', KEYS[1], 'dataset', ARGV[4], 'split', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'runs_used', 1)
redis.call('HINCRBY', KEYS[1], 'samples_used', samples)
if mine then
  redis.call('HINCRBY', KEYS[2], 'runs_used', 1)
  redis.call('HINCRBY', KEYS[2], 'samples_used', samples)
end
open_run('True')
redis.call('XADD', KEYS[3], '*', 'action', 'reserve', 'who', ARGV[3], 'dataset', ARGV[4],
  'split', ARGV[5], 'run', ARGV[2], 'runs', 1, 'samples', samples, 'at', ARGV[6],
  'principal_budget', mine and '1' or '0',
  'before', cjson.encode({runs_used = runs_used, samples_used = samples_used}),
  'after', cjson.encode({runs_used = runs_used + 1, samples_used = samples_used + samples}))
return {'ok'}
