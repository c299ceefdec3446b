-- attempt: count attempts at one stage (inference or scoring), and pick out the samples to
-- isolate instead of running.
-- KEYS[1] = the stage's attempts hash, sample id -> attempts started: RunKeys.attempts_of(INFER)
--           (inference) or RunKeys.attempts_of(SCORE) (scoring)
-- KEYS[2] = RunKeys.meta      hash, reads 'status': once the run has ended (or has no
--                                 record) nothing is counted and every count is 0 (run none)
-- KEYS[3] = RunKeys.spilled   bitmap: a spilled sample (settled, moved to a part) counts 0
-- ARGV    = id1, solo1, id2, solo2, ...   solo is 1 when the sample arrived in a message of its
--           own, 0 when it arrived with others
-- Returns: one number per id, in order: the new attempt count (> 0) of a sample that runs now,
-- or minus its earlier count (< 0) of a sample that was tried before and came with others:
-- it is not counted here; the caller sends it on alone. Counting before running means a
-- sample whose inference (or scoring) kills the worker process is counted too.
local counts = {}
local status = redis.call('HGET', KEYS[2], 'status')
if status ~= 'queued' and status ~= 'running' then
  for i = 1, #ARGV, 2 do counts[#counts + 1] = 0 end
  return counts
end
for i = 1, #ARGV, 2 do
  if redis.call('GETBIT', KEYS[3], tonumber(ARGV[i])) == 1 then
    counts[#counts + 1] = 0
  else
    -- one call for the common case (a first attempt); taken back for one that must go alone
    local count = redis.call('HINCRBY', KEYS[1], ARGV[i], 1)
    if count > 1 and ARGV[i + 1] == '0' then
      counts[#counts + 1] = -redis.call('HINCRBY', KEYS[1], ARGV[i], -1)
    else
      counts[#counts + 1] = count
    end
  end
end
return counts
