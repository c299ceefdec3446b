-- record_outputs: write inference outputs once each; count only the writes that happened.
-- KEYS[1] = RunKeys.out       hash, sample id -> output JSON (HSETNX)
-- KEYS[2] = RunKeys.progress  hash, field 'inferred' bumped by the number written,
--                                 'touched' stamped
-- KEYS[3] = RunKeys.meta      hash, 'status' moves from 'queued' to 'running'
-- KEYS[4] = RunKeys.spilled   bitmap: a spilled sample (settled, moved to a part) is skipped
-- ARGV[1] = how an output stored with its usage begins (shared.models.USAGE_PREFIX): its
--           tokens are added to the progress hash's 'prompt_tokens' / 'completion_tokens',
--           or, answered from the response cache (usage.cached), it counts in 'cached'
-- ARGV[2..] = id1, json1, id2, json2, ...
-- Returns: the number of outputs newly written (a redelivered sample writes nothing; nothing
-- is written once the run has ended, so a cancellation's refund count stays exact and no key
-- comes back after the run is archived or purged).
local status = redis.call('HGET', KEYS[3], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local written, read, wrote, cached = 0, 0, 0, 0
for i = 2, #ARGV, 2 do
  if redis.call('GETBIT', KEYS[4], tonumber(ARGV[i])) == 0 then
    local new = redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
    written = written + new
    if new == 1 and string.sub(ARGV[i + 1], 1, #ARGV[1]) == ARGV[1] then
      local usage = cjson.decode(ARGV[i + 1])['usage']
      if usage['cached'] then
        cached = cached + 1
      else
        read = read + usage['prompt_tokens']
        wrote = wrote + usage['completion_tokens']
      end
    end
  end
end
if read + wrote > 0 then
  redis.call('HINCRBY', KEYS[2], 'prompt_tokens', read)
  redis.call('HINCRBY', KEYS[2], 'completion_tokens', wrote)
end
if cached > 0 then redis.call('HINCRBY', KEYS[2], 'cached', cached) end
if written > 0 then
  redis.call('HINCRBY', KEYS[2], 'inferred', written)
  touch(KEYS[2])
  mark_running(KEYS[3])
end
return written
