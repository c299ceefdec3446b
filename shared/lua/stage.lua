-- stage: put inference messages in a run's backlog and enter the run in the fair dispatcher.
-- KEYS[1] = evalq:{run}:meta      hash, reads 'status': an ended run takes nothing
-- KEYS[2] = evalq:{run}:backlog   list of 'samples|queue|message', oldest at the right
-- KEYS[3..] = the dispatcher's keys for this principal, as fair_keys() names them
-- ARGV[1] = 'evalq:fair:', ARGV[2] = run id, ARGV[3] = principal, ARGV[4] = weight (1, 2, 4)
-- ARGV[5..] = samples1, queue1, message1, samples2, ...
-- A run new to the round joins its principal's runs at the principal's clock; a principal new
-- to it (or back) joins at the later of the global clock and its own time when it left: no
-- credit for having been away, and no way to shed the time it was served by leaving and
-- coming back.
-- Returns: samples staged (0 when the run has ended).
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local run, principal, weight = ARGV[2], ARGV[3], ARGV[4]
local f = fair_keys(ARGV[1], principal)
local staged = 0
for i = 5, #ARGV, 3 do
  redis.call('LPUSH', KEYS[2], ARGV[i] .. '|' .. ARGV[i + 1] .. '|' .. ARGV[i + 2])
  staged = staged + tonumber(ARGV[i])
end
if staged == 0 then return 0 end
redis.call('HINCRBY', f.waiting, run, staged)
redis.call('HSET', f.owner, run, principal)
redis.call('HSET', f.weight, run, weight)
if not redis.call('ZSCORE', f.runs, run) then
  redis.call('ZADD', f.runs, redis.call('HGET', f.clock, principal) or '0', run)
  redis.call('HINCRBY', f.weights, weight, 1)
end
if not redis.call('ZSCORE', f.principals, principal) then
  local clock = tonumber(redis.call('HGET', f.clock, '') or '0')
  local left = tonumber(redis.call('HGET', f.finish, principal) or '0')
  redis.call('ZADD', f.principals, math.max(clock, left), principal)
end
return staged
