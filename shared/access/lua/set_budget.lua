-- set_budget: replace a split's budget totals (or one caller's on the split), keep what was
-- used, audit it, atomically.
-- KEYS[1] = budget_key(dataset, split, caller)   hash: dataset, split, caller (if any),
--           runs_total, samples_total, max_samples_per_run, tokens_total (absent = unlimited),
--           runs_used, samples_used (never touched)
-- KEYS[2] = AUDIT                                 stream
-- ARGV[1] = dataset   ARGV[2] = split   ARGV[3] = runs_total   ARGV[4] = samples_total
-- ARGV[5] = max_samples_per_run   ARGV[6] = tokens_total ('' = unlimited for each)
-- ARGV[7] = principal   ARGV[8] = time   ARGV[9] = the caller the budget is for ('' = the split)
-- Returns: 1.
local function snapshot()
  local flat, fields = redis.call('HGETALL', KEYS[1]), {}
  for i = 1, #flat, 2 do fields[flat[i]] = flat[i + 1] end
  return cjson.encode(fields)
end
local before = snapshot()
redis.call('HSET', KEYS[1], 'dataset', ARGV[1], 'split', ARGV[2])
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'caller', ARGV[9]) end
local names = {'runs_total', 'samples_total', 'max_samples_per_run', 'tokens_total'}
for i, name in ipairs(names) do
  local value = ARGV[i + 2]
  if value == '' then redis.call('HDEL', KEYS[1], name) else redis.call('HSET', KEYS[1], name, value) end
end
redis.call('XADD', KEYS[2], '*', 'action', 'budget', 'who', ARGV[7], 'dataset', ARGV[1],
  'split', ARGV[2], 'principal', ARGV[9], 'at', ARGV[8], 'before', before, 'after', snapshot())
return 1
