-- prelude: helpers put in front of every evalq script (see shared/lua.py). Touches only the
-- keys its callers pass in.

-- A run's first write of a result moves it from 'queued' to 'running'.
-- meta = the run's evalq:{run}:meta hash key
local function mark_running(meta)
  if redis.call('HGET', meta, 'status') == 'queued' then
    redis.call('HSET', meta, 'status', 'running')
  end
end
