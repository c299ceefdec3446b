-- attempt: count attempts at one stage (inference or scoring), and pick out the samples to
-- isolate instead of running.
-- KEYS[1] = the stage's attempts hash, sample id -> attempts of a sample counted alone (one
--           that arrived alone, or was in a message delivered before):
--           RunKeys.attempts_of(INFER) (inference) or RunKeys.attempts_of(SCORE) (scoring)
-- KEYS[2] = RunKeys.meta      hash, reads 'status': once the run has ended (or has no
--                                 record) nothing is counted and every count is 0 (run none)
-- KEYS[3] = RunKeys.spilled   bitmap: a spilled sample (settled, moved to a part) counts 0
-- KEYS[4] = the stage's deliveries hash, message key -> deliveries of a message of several
--           samples: RunKeys.deliveries_of(INFER) or RunKeys.deliveries_of(SCORE)
-- ARGV    = per message: its key (the same on each delivery of it), solo (1 when it carries
--           one sample sent alone, 0 when it carries several), n, then its n sample ids (or
--           -n, then lo: its samples are lo to lo + n - 1); no id in two messages
--           or 'carry', id1, count1, id2, count2, ...: samples counted with their message go on
--           alone with those counts (a count only grows); returns nothing
-- Returns: one number per id, in order: the new attempt count (> 0) of a sample that runs now,
-- or minus its earlier count (< 0) of a sample that was tried before and came with others:
-- it is not counted here; the caller sends it on alone. Counting before running means a
-- sample whose inference (or scoring) kills the worker process is counted too.
-- A message of several samples is counted once, not each of its samples: its first delivery
-- writes one field, whatever its size (and apart from the samples' counts, so that reading
-- those is cheap while there are none). Delivered again (its worker died, or its batch went
-- back to the queue), each of its samples was tried as often as the message was before, and
-- that count is written for the sample, to go on from alone.
local counts = {}
local status = redis.call('HGET', KEYS[2], 'status')
local going = going(status)
if ARGV[1] == 'carry' then
  if not going then return counts end
  local ids = {}
  for i = 2, #ARGV, 2 do ids[#ids + 1] = ARGV[i] end
  local spilled, had = bits_of(KEYS[3], ids), hmget_all(KEYS[1], ids)
  local writes = {}
  for j, id in ipairs(ids) do
    local count = tonumber(ARGV[2 * j + 1])
    if not spilled[j] and count > (tonumber(had[j]) or 0) then
      writes[#writes + 1] = id
      writes[#writes + 1] = count
    end
  end
  hset_all(KEYS[1], writes)
  return counts
end
if not going then
  local at = 1
  while at <= #ARGV do
    local n = tonumber(ARGV[at + 2])
    for _ = 1, math.abs(n) do counts[#counts + 1] = 0 end
    at = n < 0 and at + 4 or at + 3 + n
  end
  return counts
end
return count_attempts(KEYS[1], KEYS[3], KEYS[4], 1)
