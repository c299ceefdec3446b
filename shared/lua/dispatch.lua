-- dispatch: keep a broker queue as deep as the workers need, refilling it from the runs'
-- backlogs by weighted fair queueing, first between principals, then between one principal's
-- runs (start-time fair queueing: serve the lowest virtual time; a message of s samples
-- advances its run's time by s / run weight and its principal's by s / principal weight).
-- Within a principal, the run chosen keeps its turn for ARGV[4] samples before the lowest
-- time is chosen again, so a principal's runs (a sweep of checkpoints: one model each) are not
-- cut into alternating messages that would make workers swap models at every batch.
-- KEYS[1] = the broker queue whose depth is kept (kombu's list, e.g. 'infer')
-- KEYS[2] = evalq:fair:depth      string, live worker processes consuming the queue
-- (the other keys are the dispatcher's, built by fair_keys() per principal served)
-- ARGV[1] = depth: messages the queue should hold at least (KEYS[2]'s count when greater)
-- ARGV[2] = messages to move even if the queue is that deep already (a run just submitted is
--           one message from a worker, not the queue's depth): these go to the queue's head
-- ARGV[3] = 'evalq:fair:'
-- ARGV[4] = samples a run is served in one turn of its principal's
-- ARGV[5], ARGV[6] = 'evalq:{', '}:backlog'   a run's backlog key around its id
-- Each message goes to the queue its entry names, unchanged; a run whose backlog is empty
-- (drained, or deleted by a cancel) leaves the round, and a principal with no run left leaves.
-- Returns: messages moved.
local depth = math.max(tonumber(ARGV[1]), tonumber(redis.call('GET', KEYS[2]) or '0'))
local refill = depth - redis.call('LLEN', KEYS[1])
local want = math.max(refill, tonumber(ARGV[2]))
local quantum = tonumber(ARGV[4])
local g = fair_keys(ARGV[3], '')
local moved, visits = 0, 0
while moved < want and visits < 4 * want + 64 do
  visits = visits + 1
  local top = redis.call('ZRANGE', g.principals, 0, 0, 'WITHSCORES')
  if #top == 0 then break end
  local principal, ptime = top[1], tonumber(top[2])
  local f = fair_keys(ARGV[3], principal)
  local run, rtime, left = nil, nil, quantum
  local turn = redis.call('HGET', f.turn, principal)
  if turn then
    local bar = string.find(turn, '|', 1, true)
    run, left = string.sub(turn, 1, bar - 1), tonumber(string.sub(turn, bar + 1))
    local at = redis.call('ZSCORE', f.runs, run)
    if at then rtime = tonumber(at) end
    if rtime == nil or left <= 0 then run, left = nil, quantum end
  end
  if run == nil then
    local first = redis.call('ZRANGE', f.runs, 0, 0, 'WITHSCORES')
    if #first > 0 then run, rtime = first[1], tonumber(first[2]) end
  end
  if run == nil then
    fair_leave(f, principal, '')
  else
    local backlog = ARGV[5] .. run .. ARGV[6]
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
      redis.call('HSET', f.turn, principal, run .. '|' .. (left - samples))
      moved = moved + 1
      if redis.call('LLEN', backlog) == 0 then fair_leave(f, principal, run) end
    end
  end
end
return moved
