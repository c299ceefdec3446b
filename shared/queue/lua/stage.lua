-- stage: put a run's messages for one broker queue (inference: 'infer'; scoring: 'score') in
-- its backlog for that queue and enter the run in that queue's round of the fair dispatcher;
-- then, if asked, refill the queue (fair_dispatch in prelude.lua) in the same call.
-- KEYS[1] = evalq:{run}:meta      hash, reads 'status': an ended run takes nothing
-- KEYS[2] = evalq:{run}:backlog or evalq:{run}:score_backlog   list of
--           'samples|queue|message', oldest at the right
-- KEYS[3] = the broker queue whose depth a refill keeps ('infer', 'score')
-- KEYS[4] = its depth key (evalq:fair:depth, evalq:fair:score:depth)
-- (the other keys are the dispatcher's, as fair_keys() names them, and, for a refill, the
-- backlogs of the runs it serves)
-- ARGV[1] = the round's prefix ('evalq:fair:', 'evalq:fair:score:'), ARGV[2] = run id,
-- ARGV[3] = principal, ARGV[4] = weight (1, 2, 4)
-- ARGV[5] = refill the queue to this depth after staging ('' = no refill), ARGV[6] = messages
--           to move whatever the depth (to the queue's head), ARGV[7] = samples in a turn,
-- ARGV[8], ARGV[9] = the backlog key prefix and suffix ('evalq:{', '}:backlog')
-- ARGV[10..] = samples1, queue1, message1, samples2, ...
-- A run new to the round joins its principal's runs at the principal's clock; a principal new
-- to it (or back) joins at the later of the global clock and its own time when it left: no
-- credit for having been away, and no way to shed the time it was served by leaving and
-- coming back.
-- Returns: samples staged (0 when the run has ended: nothing staged, nothing refilled).
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local run, principal, weight = ARGV[2], ARGV[3], ARGV[4]
local f = fair_keys(ARGV[1], principal)
local staged = 0
for i = 10, #ARGV, 3 do
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
if ARGV[5] ~= '' then
  fair_dispatch(KEYS[3], KEYS[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[1],
    tonumber(ARGV[7]), ARGV[8], ARGV[9])
end
return staged
