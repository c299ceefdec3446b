-- attempt: count one more inference attempt for each sample, before it runs.
-- KEYS[1] = evalq:{run}:attempts  hash, sample id -> attempts started
-- ARGV    = sample ids
-- Returns: the new attempt count of each id, in order. Counting before running means a
-- sample whose inference kills the worker process is counted too.
local counts = {}
for i = 1, #ARGV do
  counts[i] = redis.call('HINCRBY', KEYS[1], ARGV[i], 1)
end
return counts
