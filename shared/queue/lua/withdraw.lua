-- withdraw: take a cancelled run out of every round of the fair dispatcher and delete its
-- backlogs (cancel.lua deleted its inference backlog already; its scoring backlog goes here).
-- KEYS[i] = the run's backlog for round i (evalq:{run}:backlog, evalq:{run}:score_backlog)
-- (the other keys are the dispatcher's: fair_keys() builds those of the run's principal)
-- ARGV[1] = run id, ARGV[1 + i] = round i's prefix ('evalq:fair:', 'evalq:fair:score:')
-- Returns: 1 if the run was in a round, 0 if not.
local found = 0
for i = 1, #KEYS do
  redis.call('DEL', KEYS[i])
  local prefix = ARGV[1 + i]
  local owner = redis.call('HGET', prefix .. 'owner', ARGV[1])
  if owner then
    fair_leave(fair_keys(prefix, owner), owner, ARGV[1])
    found = 1
  end
end
return found
