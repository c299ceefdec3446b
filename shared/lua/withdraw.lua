-- withdraw: take a run out of the fair dispatcher's round (it was cancelled: cancel.lua
-- deleted its backlog).
-- KEYS = the dispatcher's keys (fair_keys() builds those of the run's principal)
-- ARGV[1] = 'evalq:fair:', ARGV[2] = run id
-- Returns: 1 if the run was in the round, 0 if not.
local owner = redis.call('HGET', ARGV[1] .. 'owner', ARGV[2])
if not owner then return 0 end
fair_leave(fair_keys(ARGV[1], owner), owner, ARGV[2])
return 1
