-- settle: give samples their terminal state (a score or an error) exactly once, and elect the
-- one caller that finalizes the run.
-- KEYS[1] = RunKeys.score     hash, sample id -> metrics JSON, or 'lo-hi' -> a span's metrics
-- KEYS[2] = RunKeys.err       hash, sample id -> error record JSON
-- KEYS[3] = RunKeys.progress  hash, fields 'scored' / 'failed' bumped per write, 'touched'
-- KEYS[4] = RunKeys.meta      hash, reads 'status', 'finalizing' = claim time
-- KEYS[5] = RunKeys.settled   stream, one entry listing the ids settled by this call (a span's
--                                 as 'lo-hi')
-- KEYS[6] = RunKeys.attempts_of(INFER), KEYS[7] = RunKeys.attempts_of(SCORE)   hashes,
--           sample id -> attempts: with ARGV[5] = 1, the counts of every sample given are
--           deleted, written now or settled before (a late attempt's count served no purpose
--           either); ARGV[5] = 0: none of them was counted alone (attempt.lua), nothing to
--           delete
-- KEYS[8] = RunKeys.spilled   bitmap: a spilled sample (settled, moved to a part) is skipped
-- KEYS[9] = RunKeys.done      bitmap: a sample's bit is set as it settles; a set one is skipped
-- KEYS[10] = RunKeys.ranges_of('scores')  sorted set of the spans in KEYS[1]
-- KEYS[11] = RunKeys.grade    hash, sample id -> a grader's verdict JSON, written with the
--           sample's scores: its tokens are counted in the progress's 'grader_prompt_tokens'
--           and 'grader_completion_tokens', apart from the model under test's (not a cached
--           one's); only this field is read for them, never a score
-- ARGV[1] = 'score' or 'err'      which hash the values go to
-- ARGV[2] = seconds after which a claim to finalize counts as dead (its finalizer was killed)
--           and may be taken over; '' = never
-- ARGV[3] = the run's sample count, from its facts (RunKeys.facts, which workers may only
--           read, so it cannot be a key of this script); -1: no such run
-- ARGV[4] = the values given per sample: 2 (id, value) or 3 (id, scores, grade JSON or ''
--           for none; 'score' only)
-- ARGV[5] = 1 to delete the samples' attempt counts, 0 when they have none
-- ARGV[6..] = id1, json1[, grade1], id2, json2[, grade2], ...   (none: only ask whether to
--             finalize; an id given twice is written once, the first); or ARGV[6] = '~',
--             ARGV[7] = lo, ARGV[8] = n,
--             ARGV[9] = the scores of samples lo to lo + n - 1 joined by newlines (none with
--             a grade): a span, written as one field when none of them is settled yet, else
--             nothing is (the reply is {-1, 0, 0})
-- A value is written only when the sample has neither a score nor an error yet, and nothing
-- is written once the run is cancelled.
-- Calls: a few per batch, not per sample (a span: a BITCOUNT, one HSET, a ZADD, the bits).
-- Returns: {written, finalize, settled}; finalize is 1 for the one caller that saw every sample
-- settled first (or that takes over a dead claim), and 0 for everyone else; settled = the run's
-- samples settled so far.
local status = redis.call('HGET', KEYS[4], 'status')
if not going(status) then return {0, 0, 0} end
local target, counter = KEYS[1], 'scored'
if ARGV[1] == 'err' then target, counter = KEYS[2], 'failed' end
local written, listed, given = 0, '', {}
local stride, read, wrote = tonumber(ARGV[4]), 0, 0
if ARGV[6] == '~' then
  local lo, n = tonumber(ARGV[7]), tonumber(ARGV[8])
  local hi = lo + n - 1
  if not write_span(KEYS[1], KEYS[10], KEYS[9], KEYS[8], lo, hi, ARGV[9]) then
    return {-1, 0, 0}
  end
  written, listed = n, lo .. '-' .. hi
  if ARGV[5] == '1' then given = span_ids(lo, n) end
else
  local ids = {}
  for i = 6, #ARGV, stride do given[#given + 1] = ARGV[i] end
  local spilled, settled, writes, seen = bits_of(KEYS[8], given), bits_of(KEYS[9], given), {}, {}
  local grades = {}
  for j, id in ipairs(given) do
    local at_id = 6 + stride * (j - 1)
    if not spilled[j] and not settled[j] and not seen[id] then
      seen[id] = true
      written = written + 1
      ids[written] = id
      writes[#writes + 1] = id
      writes[#writes + 1] = ARGV[at_id + 1]
      local graded = stride == 3 and ARGV[at_id + 2] or ''
      if graded ~= '' then
        grades[#grades + 1] = id
        grades[#grades + 1] = graded
        local usage = cjson.decode(graded).usage
        if not usage.cached then -- a cached verdict asked nothing
          read, wrote = read + usage.prompt_tokens, wrote + usage.completion_tokens
        end
      end
    end
  end
  hset_all(target, writes)
  hset_all(KEYS[11], grades)
  set_bits(KEYS[9], ids)
  listed = table.concat(ids, ',')
end
if read > 0 then redis.call('HINCRBY', KEYS[3], 'grader_prompt_tokens', read) end
if wrote > 0 then redis.call('HINCRBY', KEYS[3], 'grader_completion_tokens', wrote) end
if ARGV[5] == '1' then hdel_all({KEYS[6], KEYS[7]}, given) end
if written > 0 then
  redis.call('XADD', KEYS[5], '*', 'ids', listed)
  redis.call('HINCRBY', KEYS[3], counter, written)
  touch(KEYS[3])
  mark_running(KEYS[4], status)
end
local n = tonumber(ARGV[3])
local counts = redis.call('HMGET', KEYS[3], 'scored', 'failed')
local done = tonumber(counts[1] or '0') + tonumber(counts[2] or '0')
if n < 0 or done < n then return {written, 0, done} end
local claimed = tonumber(redis.call('HGET', KEYS[4], 'finalizing') or '')
if claimed and (ARGV[2] == '' or now() - claimed < tonumber(ARGV[2])) then
  return {written, 0, done}
end
redis.call('HSET', KEYS[4], 'finalizing', string.format('%.6f', now()))
return {written, 1, done}
