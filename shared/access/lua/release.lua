-- release: fix what one run's aggregate releases to its caller, move the caller's Ladder, and
-- audit it, atomically; refuses when the Ladder moved since it was read.
-- KEYS[1] = release_best_key(principal, dataset, split, eval)   hash, metric -> JSON best
-- KEYS[2] = release_run_key(run)                                 string, released JSON
-- KEYS[3] = AUDIT                                                stream
-- ARGV[1] = released JSON   ARGV[2] = audit JSON (why, per metric)   ARGV[3] = principal
-- ARGV[4] = dataset   ARGV[5] = split   ARGV[6] = run   ARGV[7] = unix time
-- ARGV[8] = the release rule (audited as its mechanism)
-- ARGV[9..] = (metric, best as read or '', new best or '') triples
-- Returns: the run's released JSON (this call's, or an earlier call's), or false when a best
-- changed since it was read (read again and retry).
local done = redis.call('GET', KEYS[2])
if done then
  return done
end
for i = 9, #ARGV, 3 do
  if (redis.call('HGET', KEYS[1], ARGV[i]) or '') ~= ARGV[i + 1] then
    return false
  end
end
for i = 9, #ARGV, 3 do
  if ARGV[i + 2] ~= '' then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  end
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], '*', 'action', 'released', 'who', ARGV[3], 'dataset', ARGV[4],
  'split', ARGV[5], 'run', ARGV[6], 'mechanism', ARGV[8], 'at', ARGV[7], 'before', 'null',
  'after', ARGV[2])
return ARGV[1]
