-- withdraw: take a cancelled run out of every round of the fair dispatcher and delete its
-- backlogs (cancel.lua deleted its inference backlog already; its scoring backlog goes here).
-- For round i, with k = 9 * (i - 1) and a = 6 * (i - 1) + 1:
-- KEYS[k + 1] = the run's backlog in round i (RunKeys.backlog_of(stage))
-- KEYS[k + 2 .. k + 9] = round i's keys (fair_round in the queue's prelude.lua)
-- ARGV[1] = run id
-- ARGV[a + 1 .. a + 6] = round i's key templates (fair_round in the queue's prelude.lua)
-- Returns: 1 if the run was in a round, 0 if not.
local run, found = ARGV[1], 0
for i = 1, #KEYS / 9 do
  local k, a = 9 * (i - 1), 6 * (i - 1) + 1
  redis.call('DEL', KEYS[k + 1])
  local round = fair_round(k + 2, a + 1)
  local owner = redis.call('HGET', round.owner, run)
  if owner then
    fair_leave(fair_keys(round, owner), owner, run)
    found = 1
  end
end
return found
