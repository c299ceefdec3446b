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

-- Delete the fields listed in the table ``fields`` from each hash in the table ``hashes``, a
-- thousand at a time (unpack() has a stack limit).
local function hdel_all(hashes, fields)
  for from = 1, #fields, 1000 do
    local upto = math.min(from + 999, #fields)
    for _, key in ipairs(hashes) do redis.call('HDEL', key, unpack(fields, from, upto)) end
  end
end

-- A run made progress: stamp its progress hash (``status`` and the janitor read it).
-- progress = the run's evalq:{run}:progress hash key
local function touch(progress)
  redis.call('HSET', progress, 'touched', string.format('%.6f', now()))
end

-- Fair share (shared/backlog.py): keys of the dispatcher, in a table built by fair_keys().
-- p = principal; prefix = 'evalq:fair:'
local function fair_keys(prefix, principal)
  return {
    principals = prefix .. 'principals', clock = prefix .. 'clock',
    finish = prefix .. 'finish', owner = prefix .. 'owner', weight = prefix .. 'weight',
    waiting = prefix .. 'waiting', turn = prefix .. 'turn',
    runs = prefix .. 'runs:' .. principal, weights = prefix .. 'weights:' .. principal,
  }
end

-- The weight a principal has in the round: that of its highest-priority backlogged run.
local function fair_principal_weight(f)
  local best = 1
  local counts = redis.call('HGETALL', f.weights)
  for i = 1, #counts, 2 do
    local w = tonumber(counts[i])
    if tonumber(counts[i + 1]) > 0 and w > best then best = w end
  end
  return best
end

-- A run leaves its principal's round (drained or cancelled); a principal left with no run
-- leaves the round, remembering its virtual time so that it cannot come back ahead of it.
local function fair_leave(f, principal, run)
  local weight = redis.call('HGET', f.weight, run)
  if redis.call('ZREM', f.runs, run) == 1 and weight then
    if redis.call('HINCRBY', f.weights, weight, -1) <= 0 then
      redis.call('HDEL', f.weights, weight)
    end
  end
  redis.call('HDEL', f.owner, run)
  redis.call('HDEL', f.weight, run)
  redis.call('HDEL', f.waiting, run)
  local turn = redis.call('HGET', f.turn, principal)
  if turn and string.sub(turn, 1, #run + 1) == run .. '|' then
    redis.call('HDEL', f.turn, principal)
  end
  if redis.call('ZCARD', f.runs) == 0 then
    local at = redis.call('ZSCORE', f.principals, principal)
    if at then redis.call('HSET', f.finish, principal, at) end
    redis.call('ZREM', f.principals, principal)
    redis.call('HDEL', f.clock, principal)
    redis.call('DEL', f.weights)
  end
end
