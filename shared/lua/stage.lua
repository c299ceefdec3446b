-- stage: put inference messages in a run's backlog and enter the run in the fair dispatcher.
-- KEYS[1] = evalq:{run}:meta              hash, reads 'status': an ended run takes nothing
-- KEYS[2] = evalq:{run}:backlog           list of 'samples|queue|message', oldest at the right
-- KEYS[3] = evalq:fair:principals         zset, principal -> virtual time
-- KEYS[4] = evalq:fair:runs:<principal>   zset, run -> virtual time within the principal
-- KEYS[5] = evalq:fair:clock              hash, '' / principal -> virtual time served last
-- KEYS[6] = evalq:fair:owner              hash, run -> principal
-- KEYS[7] = evalq:fair:weight             hash, run -> weight
-- KEYS[8] = evalq:fair:principal_weight   hash, principal -> its highest run weight
-- KEYS[9] = evalq:fair:waiting            hash, run -> samples in its backlog
-- ARGV[1] = run id, ARGV[2] = principal, ARGV[3] = weight (a positive integer)
-- ARGV[4..] = samples1, queue1, message1, samples2, ...
-- A run new to the dispatcher (or back after its backlog ran dry) joins its principal's round
-- at the principal's clock, and a principal new to it joins at the global clock: it is served
-- next, without credit for the time it was away.
-- Returns: samples staged (0 when the run has ended).
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local run, principal, weight = ARGV[1], ARGV[2], tonumber(ARGV[3])
local staged = 0
for i = 4, #ARGV, 3 do
  redis.call('LPUSH', KEYS[2], ARGV[i] .. '|' .. ARGV[i + 1] .. '|' .. ARGV[i + 2])
  staged = staged + tonumber(ARGV[i])
end
if staged == 0 then return 0 end
redis.call('HINCRBY', KEYS[9], run, staged)
redis.call('HSET', KEYS[6], run, principal)
redis.call('HSET', KEYS[7], run, weight)
if weight > tonumber(redis.call('HGET', KEYS[8], principal) or '0') then
  redis.call('HSET', KEYS[8], principal, weight)
end
if not redis.call('ZSCORE', KEYS[4], run) then
  redis.call('ZADD', KEYS[4], redis.call('HGET', KEYS[5], principal) or '0', run)
end
if not redis.call('ZSCORE', KEYS[3], principal) then
  redis.call('ZADD', KEYS[3], redis.call('HGET', KEYS[5], '') or '0', principal)
end
return staged
