-- record_outputs: write inference outputs once each; count only the writes that happened.
-- KEYS[1] = evalq:{run}:out       hash, sample id -> output JSON (HSETNX)
-- KEYS[2] = evalq:{run}:progress  hash, field 'inferred' bumped by the number written,
--                                 'touched' stamped
-- KEYS[3] = evalq:{run}:meta      hash, 'status' moves from 'queued' to 'running'
-- KEYS[4] = evalq:{run}:spilled   bitmap: a spilled sample (settled, moved to a part) is skipped
-- ARGV    = id1, json1, id2, json2, ...
-- Returns: the number of outputs newly written (a redelivered sample writes nothing; nothing
-- is written once the run has ended, so a cancellation's refund count stays exact and no key
-- comes back after the run is archived or purged).
local status = redis.call('HGET', KEYS[3], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local written = 0
for i = 1, #ARGV, 2 do
  if redis.call('GETBIT', KEYS[4], tonumber(ARGV[i])) == 0 then
    written = written + redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if written > 0 then
  redis.call('HINCRBY', KEYS[2], 'inferred', written)
  touch(KEYS[2])
  mark_running(KEYS[3])
end
return written
