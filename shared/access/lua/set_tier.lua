-- set_tier: set a split's tier and audit the change, atomically.
-- KEYS[1] = tiers_key(dataset)   hash, split -> tier
-- KEYS[2] = AUDIT                stream
-- ARGV[1] = split   ARGV[2] = tier   ARGV[3] = principal   ARGV[4] = dataset   ARGV[5] = unix time
-- Returns: the previous tier, or false when the split was unlisted.
local before = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], '*', 'action', 'tier', 'who', ARGV[3], 'dataset', ARGV[4],
  'split', ARGV[1], 'at', ARGV[5], 'before', cjson.encode(before or cjson.null),
  'after', cjson.encode(ARGV[2]))
return before
