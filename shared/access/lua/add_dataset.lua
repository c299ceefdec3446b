-- add_dataset: register (or re-pin) a dataset and audit it, atomically; a file's content has
-- one owner split for good, so a copy or link of one split's file cannot be registered as
-- another split, of another dataset or of this one (re-pinning cannot move content across).
-- KEYS[1] = DATASETS        hash, name -> record JSON
-- KEYS[2] = DATASET_FILES   hash, sha256 -> 'name/split'
-- KEYS[3] = AUDIT           stream
-- ARGV[1] = name   ARGV[2] = record JSON   ARGV[3] = principal   ARGV[4] = unix time
-- ARGV[5], ARGV[6], ... = pairs of file sha256 and the 'name/split' that holds it
-- Returns: {'ok', previous record or ''} or {'taken', sha256, its owner 'name/split'}.
local before = redis.call('HGET', KEYS[1], ARGV[1])
local mine = {}
if before then
  for split, source in pairs(cjson.decode(before)['splits']) do
    for _, file in ipairs(source['files'] or {}) do mine[file['sha256']] = true end
  end
end
local seen = {}
for i = 5, #ARGV, 2 do
  local owner = redis.call('HGET', KEYS[2], ARGV[i])
  if owner and owner ~= ARGV[i + 1] then return {'taken', ARGV[i], owner} end
  if seen[ARGV[i]] and seen[ARGV[i]] ~= ARGV[i + 1] then return {'taken', ARGV[i], seen[ARGV[i]]} end
  seen[ARGV[i]] = ARGV[i + 1]
end
for digest, _ in pairs(mine) do redis.call('HDEL', KEYS[2], digest) end
for digest, owner in pairs(seen) do redis.call('HSET', KEYS[2], digest, owner) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[3], '*', 'action', 'dataset', 'who', ARGV[3], 'dataset', ARGV[1],
  'split', '', 'run', '', 'at', ARGV[4], 'before', before or 'null', 'after', ARGV[2])
return {'ok', before or ''}
