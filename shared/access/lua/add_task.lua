-- add_task: register (or replace) a language-model task and audit it, atomically.
-- KEYS[1] = TASKS   hash, name -> record JSON
-- KEYS[2] = AUDIT   stream
-- ARGV[1] = name   ARGV[2] = record JSON   ARGV[3] = principal   ARGV[4] = unix time
-- Returns: the previous record, or '' when the name was free.
local before = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('XADD', KEYS[2], '*', 'action', 'task', 'who', ARGV[3], 'dataset', '', 'split', '',
  'run', '', 'at', ARGV[4], 'before', before or 'null', 'after', ARGV[2])
return before or ''
