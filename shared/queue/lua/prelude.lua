-- The fair dispatcher's functions, put in front of the queue package's scripts (stage, dispatch,
-- withdraw) after the store's prelude (see shared/store/scripts.py).

-- Fair share (shared/queue/backlog.py): the keys of one round of the dispatcher, as its caller
-- passes them (Lane.round_keys, Lane.round_args; the names are shared/keys.py's FairKeys and
-- RunKeys). Each broker queue it keeps has a round of its own.
-- k: KEYS[k .. k+7] = the round's principals, clock, finish, owner, weight, waiting, turn and
--    model
-- a: ARGV[a .. a+5] = the prefix and suffix around a principal's name of its runs key and of
--    its weights key, and around a run's id of its backlog key
local function fair_round(k, a)
  return {
    principals = KEYS[k], clock = KEYS[k + 1], finish = KEYS[k + 2], owner = KEYS[k + 3],
    weight = KEYS[k + 4], waiting = KEYS[k + 5], turn = KEYS[k + 6], model = KEYS[k + 7],
    runs = {ARGV[a], ARGV[a + 1]}, weights = {ARGV[a + 2], ARGV[a + 3]},
    backlog = {ARGV[a + 4], ARGV[a + 5]},
  }
end

-- The round's keys in a table for one principal: its runs and weights keys named in full.
local function fair_keys(round, principal)
  local f = {}
  for name, key in pairs(round) do f[name] = key end
  f.runs = round.runs[1] .. principal .. round.runs[2]
  f.weights = round.weights[1] .. principal .. round.weights[2]
  return f
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
  redis.call('HDEL', f.model, run)
  if redis.call('ZCARD', f.runs) == 0 then
    local at = redis.call('ZSCORE', f.principals, principal)
    if at then redis.call('HSET', f.finish, principal, at) end
    redis.call('ZREM', f.principals, principal)
    redis.call('HDEL', f.clock, principal)
    redis.call('HDEL', f.turn, principal)
    redis.call('DEL', f.weights)
  end
end

-- The principal's backlogged run of ``model`` with the lowest virtual time, among its 64
-- lowest (nil, nil when none of them runs that model).
local function fair_first_of(f, model)
  local runs = redis.call('ZRANGE', f.runs, 0, 63, 'WITHSCORES')
  for i = 1, #runs, 2 do
    if (redis.call('HGET', f.model, runs[i]) or runs[i]) == model then
      return runs[i], tonumber(runs[i + 1])
    end
  end
  return nil, nil
end

-- The run a principal's turn serves now: while the turn lasts (``seconds`` of Redis's clock
-- from its start), the lowest-time run of the turn's model (runs on one warm model
-- interleave freely); else the lowest-time run, whose model starts a new turn.
local function fair_turn(f, principal, seconds)
  local turn = redis.call('HGET', f.turn, principal)
  if turn then
    local model, deadline = string.match(turn, '^(.*)|([^|]*)$')
    if model and now() < tonumber(deadline) then
      local run, rtime = fair_first_of(f, model)
      if run then return run, rtime end
    end
  end
  local first = redis.call('ZRANGE', f.runs, 0, 0, 'WITHSCORES')
  if #first == 0 then return nil, nil end
  local model = redis.call('HGET', f.model, first[1]) or first[1]
  redis.call('HSET', f.turn, principal, model .. '|' .. string.format('%.6f', now() + seconds))
  return first[1], tonumber(first[2])
end

-- Refill one broker queue from its round's backlogs (dispatch.lua, stage.lua): keep it at
-- least ``depth`` messages deep (the janitor's count at ``depth_key`` when greater) and move
-- ``at_least`` messages whatever its depth, those beyond the depth to its head (the fair
-- choice of this moment goes before what was chosen earlier). Weighted fair queueing
-- (start-time fair queueing: serve the lowest virtual time; a message of s samples advances
-- its run's time by s / run weight and its principal's by s / principal weight), first between
-- principals, then between one principal's runs; within a principal, a turn serves one model
-- for ``seconds`` (fair_turn) before the lowest time is chosen again, so a principal's runs on
-- different models (a sweep of checkpoints) are not cut into alternating messages that would
-- make workers swap models at every batch, while its runs on one model (a small run beside a
-- big one) interleave by time at once. Each message goes to the queue its entry names,
-- unchanged; a run whose backlog is empty (drained, or deleted by a cancel) leaves the round,
-- and a principal with no run left leaves.
-- round = the round's keys (fair_round); queue = the broker queue whose depth is kept
-- (kombu's list); depth_key = its FairKeys.depth string.
-- Returns: messages moved.
local function fair_dispatch(round, queue, depth_key, depth, at_least, seconds)
  depth = math.max(depth, tonumber(redis.call('GET', depth_key) or '0'))
  local refill = depth - redis.call('LLEN', queue)
  local want = math.max(refill, at_least)
  local moved, visits = 0, 0
  while moved < want and visits < 4 * want + 64 do
    visits = visits + 1
    local top = redis.call('ZRANGE', round.principals, 0, 0, 'WITHSCORES')
    if #top == 0 then break end
    local principal, ptime = top[1], tonumber(top[2])
    local f = fair_keys(round, principal)
    local run, rtime = fair_turn(f, principal, seconds)
    if run == nil then
      fair_leave(f, principal, '')
    else
      local backlog = round.backlog[1] .. run .. round.backlog[2]
      local entry = redis.call('RPOP', backlog)
      if not entry then
        fair_leave(f, principal, run)
      else
        local a = string.find(entry, '|', 1, true)
        local b = string.find(entry, '|', a + 1, true)
        local samples = tonumber(string.sub(entry, 1, a - 1))
        local push = 'LPUSH'
        if moved >= refill then push = 'RPUSH' end  -- kombu pops from the right: the head
        redis.call(push, string.sub(entry, a + 1, b - 1), string.sub(entry, b + 1))
        redis.call('HINCRBY', f.waiting, run, -samples)
        local rweight = tonumber(redis.call('HGET', f.weight, run) or '1')
        redis.call('HSET', f.clock, principal, rtime, '', ptime)
        redis.call('ZADD', f.runs, rtime + samples / rweight, run)
        redis.call('ZADD', f.principals, ptime + samples / fair_principal_weight(f), principal)
        moved = moved + 1
        if redis.call('LLEN', backlog) == 0 then fair_leave(f, principal, run) end
      end
    end
  end
  return moved
end
