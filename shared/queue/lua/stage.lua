-- stage: put a run's messages for one broker queue (inference: 'infer'; scoring: 'score') in
-- its backlog for that queue and enter the run in that queue's round of the fair dispatcher;
-- then, if asked, refill the queue (fair_dispatch in the queue's prelude.lua) in the same call.
-- KEYS[1] = RunKeys.meta        hash, reads 'status': an ended run takes nothing
-- KEYS[2] = RunKeys.backlog_of(stage)   list of 'samples|queue|message', oldest at the right
-- KEYS[3] = the broker queue whose depth a refill keeps ('infer', 'score')
-- KEYS[4] = its FairKeys.depth
-- KEYS[5..12] = the round's keys (fair_round in the queue's prelude.lua)
-- ARGV[1] = run id   ARGV[2] = principal   ARGV[3] = weight (1, 2, 4)
-- ARGV[4] = refill the queue to this depth after staging ('' = no refill)
-- ARGV[5] = messages to move whatever the depth (to the queue's head)
-- ARGV[6] = seconds a turn serves one model
-- ARGV[7] = the run's model (runs of one model interleave within a turn)
-- ARGV[8..13] = the round's key templates (fair_round in the queue's prelude.lua)
-- ARGV[14..] = samples1, queue1, message1, samples2, ...
-- A run new to the round joins its principal's runs at the principal's clock; a principal new
-- to it (or back) joins at the later of the global clock and its own time when it left: no
-- credit for having been away, and no way to shed the time it was served by leaving and
-- coming back.
-- Returns: samples staged (0 when the run has ended: nothing staged, nothing refilled).
local status = redis.call('HGET', KEYS[1], 'status')
if not going(status) then return 0 end
local run, principal, weight = ARGV[1], ARGV[2], ARGV[3]
local round = fair_round(5, 8)
local f = fair_keys(round, principal)
local staged = 0
for i = 14, #ARGV, 3 do
  redis.call('LPUSH', KEYS[2], ARGV[i] .. '|' .. ARGV[i + 1] .. '|' .. ARGV[i + 2])
  staged = staged + tonumber(ARGV[i])
end
if staged == 0 then return 0 end
redis.call('HINCRBY', f.waiting, run, staged)
redis.call('HSET', f.owner, run, principal)
redis.call('HSET', f.weight, run, weight)
redis.call('HSET', f.model, run, ARGV[7])
if not redis.call('ZSCORE', f.runs, run) then
  redis.call('ZADD', f.runs, redis.call('HGET', f.clock, principal) or '0', run)
  redis.call('HINCRBY', f.weights, weight, 1)
end
if not redis.call('ZSCORE', f.principals, principal) then
  local clock = tonumber(redis.call('HGET', f.clock, '') or '0')
  local left = tonumber(redis.call('HGET', f.finish, principal) or '0')
  redis.call('ZADD', f.principals, math.max(clock, left), principal)
end
if ARGV[4] ~= '' then
  fair_dispatch(round, KEYS[3], KEYS[4], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
end
return staged
