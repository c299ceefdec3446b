-- dispatch: keep a broker queue as deep as the workers need, refilling it from the runs'
-- backlogs by weighted fair queueing, first between principals, then between one principal's
-- runs (start-time fair queueing: serve the lowest virtual time; a message of s samples
-- advances its run's time by s / run weight and its principal's by s / principal weight).
-- KEYS[1] = evalq:fair:principals         zset, principal -> virtual time
-- KEYS[2] = evalq:fair:clock              hash, '' / principal -> virtual time served last
-- KEYS[3] = evalq:fair:owner              hash, run -> principal
-- KEYS[4] = evalq:fair:weight             hash, run -> weight
-- KEYS[5] = evalq:fair:principal_weight   hash, principal -> its highest run weight
-- KEYS[6] = evalq:fair:waiting            hash, run -> samples in its backlog
-- KEYS[7] = the broker queue whose depth is kept (kombu's list, e.g. 'infer')
-- KEYS[8] = evalq:fair:depth              string, live worker processes consuming the queue
-- ARGV[1] = depth: messages the queue should hold at least (KEYS[8]'s count when greater)
-- ARGV[2] = 'evalq:fair:runs:'            prefix of a principal's runs zset
-- ARGV[3], ARGV[4] = 'evalq:{', '}:backlog'   a run's backlog key around its id
-- ARGV[5] = messages to move even if the queue is that deep already (a run just submitted is
--           one message from a worker, not the queue's depth): these go to the queue's head
-- Each message goes to the queue its entry names, unchanged; a run whose backlog is empty
-- (drained, or deleted by a cancel) leaves the round, and a principal with no run left leaves.
-- Returns: messages moved.

local function leave(principal, runs, run)
  redis.call('ZREM', runs, run)
  redis.call('HDEL', KEYS[3], run)
  redis.call('HDEL', KEYS[4], run)
  redis.call('HDEL', KEYS[6], run)
  local left = redis.call('ZRANGE', runs, 0, -1)
  if #left == 0 then
    redis.call('ZREM', KEYS[1], principal)
    redis.call('HDEL', KEYS[2], principal)
    redis.call('HDEL', KEYS[5], principal)
    return
  end
  local highest = 1
  for _, other in ipairs(left) do
    local w = tonumber(redis.call('HGET', KEYS[4], other) or '1')
    if w > highest then highest = w end
  end
  redis.call('HSET', KEYS[5], principal, highest)
end

local depth = math.max(tonumber(ARGV[1]), tonumber(redis.call('GET', KEYS[8]) or '0'))
local refill = depth - redis.call('LLEN', KEYS[7])
local want = math.max(refill, tonumber(ARGV[5]))
local moved, visits = 0, 0
while moved < want and visits < 4 * want + 64 do
  visits = visits + 1
  local top = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if #top == 0 then break end
  local principal, ptime = top[1], tonumber(top[2])
  local runs = ARGV[2] .. principal
  local first = redis.call('ZRANGE', runs, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', KEYS[1], principal)
    redis.call('HDEL', KEYS[2], principal)
    redis.call('HDEL', KEYS[5], principal)
  else
    local run, rtime = first[1], tonumber(first[2])
    local backlog = ARGV[3] .. run .. ARGV[4]
    local entry = redis.call('RPOP', backlog)
    if not entry then
      leave(principal, runs, run)
    else
      local a = string.find(entry, '|', 1, true)
      local b = string.find(entry, '|', a + 1, true)
      local samples = tonumber(string.sub(entry, 1, a - 1))
      local push = 'LPUSH'
      if moved >= refill then push = 'RPUSH' end  -- kombu pops from the right: the head
      redis.call(push, string.sub(entry, a + 1, b - 1), string.sub(entry, b + 1))
      redis.call('HINCRBY', KEYS[6], run, -samples)
      local rweight = tonumber(redis.call('HGET', KEYS[4], run) or '1')
      local pweight = tonumber(redis.call('HGET', KEYS[5], principal) or '1')
      redis.call('HSET', KEYS[2], principal, rtime, '', ptime)
      redis.call('ZADD', runs, rtime + samples / rweight, run)
      redis.call('ZADD', KEYS[1], ptime + samples / pweight, principal)
      moved = moved + 1
      if redis.call('LLEN', backlog) == 0 then leave(principal, runs, run) end
    end
  end
end
return moved
