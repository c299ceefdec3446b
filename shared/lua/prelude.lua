-- prelude: helpers put in front of every evalq script (see shared/lua.py). Touches only the
-- keys its callers pass in.

-- A run's first write of a result moves it from 'queued' to 'running'.
-- meta = the run's evalq:{run}:meta hash key
local function mark_running(meta)
  if redis.call('HGET', meta, 'status') == 'queued' then
    redis.call('HSET', meta, 'status', 'running')
  end
end

-- The Redis server's clock, in seconds with microseconds: one clock for every worker.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end

-- A run made progress: stamp its progress hash (``status`` and the janitor read it).
-- progress = the run's evalq:{run}:progress hash key
local function touch(progress)
  redis.call('HSET', progress, 'touched', string.format('%.6f', now()))
end
