-- record_outputs: write inference outputs once each; count only the writes that happened; and,
-- for a batch scored in the same job (the fused path), count the score-stage attempt of its
-- samples once every output given was written here (attempt.lua's count, in the same call).
-- KEYS[1] = RunKeys.out       hash, sample id -> output JSON, or 'lo-hi' -> a span's outputs
-- KEYS[2] = RunKeys.progress  hash, field 'inferred' bumped by the number written,
--                                 'touched' stamped
-- KEYS[3] = RunKeys.meta      hash, 'status' moves from 'queued' to 'running'
-- KEYS[4] = RunKeys.spilled   bitmap: a spilled sample (settled, moved to a part) is skipped
-- KEYS[5] = RunKeys.attempts_of(SCORE)    hash, as attempt.lua's KEYS[1] (scoring)
-- KEYS[6] = RunKeys.deliveries_of(SCORE)  hash, as attempt.lua's KEYS[4] (scoring)
-- KEYS[7] = RunKeys.inferred  bitmap: a sample's bit is set with its output; a set one is
--                                 skipped
-- KEYS[8] = RunKeys.ranges_of('outputs')  sorted set of the spans in KEYS[1]
-- KEYS[9] = RunKeys.usage     hash, sample id -> usage JSON, written with the sample's output:
--           its tokens are added to the progress hash's 'prompt_tokens' /
--           'completion_tokens', or, answered from the response cache (usage.cached), it
--           counts in 'cached' (only this field is read for tokens, never an output)
-- ARGV[1] = the values given per output: 2 (id, output) or 3 (id, output, usage JSON or ''
--           for none)
-- ARGV[2] = n, the number of outputs that follow
-- ARGV[3 .. 2 + ARGV[1] * n] = id1, json1[, usage1], id2, json2[, usage2], ...   (an id given
--           twice is written once, the first); or ARGV[3] = '~', ARGV[4] = lo, ARGV[5] = the
--           outputs of samples lo to lo + n - 1 joined by newlines (none with a usage): a span,
--           written as one field when none of them has an output yet, else nothing is (the
--           reply is {-1})
-- ARGV[next ..] = the score-stage attempt to count, as attempt.lua's ARGV (per message: its
--           key, solo, count, its ids); or '=' and then per message its key, solo and count
--           only, its ids being the next count of the outputs' ids in order (the messages
--           bring exactly the outputs' samples, in their order); none: nothing counted
-- Returns: {written, counts...}: the number of outputs newly written (a redelivered sample
-- writes nothing; nothing is written once the run has ended, so a cancellation's refund count
-- stays exact and no key comes back after the run is archived or purged), then, when an
-- attempt was given and all n outputs were written now, the attempt counts in order (as
-- attempt.lua returns them); otherwise nothing is counted (the caller counts as it scores).
-- Calls: a few per batch, not per sample (a span: a BITCOUNT, one HSET, a ZADD, the bits).
local status = redis.call('HGET', KEYS[3], 'status')
if not going(status) then return {0} end
local n, stride = tonumber(ARGV[2]), tonumber(ARGV[1])
local ids, writes, at = {}, {}, 3 + stride * n
local read, wrote, cached = 0, 0, 0
local written = 0
if ARGV[3] == '~' then -- ids: the span's first, lo (count_attempts makes the others if needed)
  local lo = tonumber(ARGV[4])
  ids, at = lo, 6
  if not write_span(KEYS[1], KEYS[8], KEYS[7], KEYS[4], lo, lo + n - 1, ARGV[5]) then
    return {-1}
  end
  written = n
else
  for i = 3, 2 + stride * n, stride do ids[#ids + 1] = ARGV[i] end
  local spilled, present, seen = bits_of(KEYS[4], ids), bits_of(KEYS[7], ids), {}
  local pairs, usages = {}, {}
  for j, id in ipairs(ids) do
    local at_id = 3 + stride * (j - 1)
    if not spilled[j] and not present[j] and not seen[id] then
      seen[id] = true
      writes[#writes + 1] = id
      pairs[#pairs + 1] = id
      pairs[#pairs + 1] = ARGV[at_id + 1]
      local used = stride == 3 and ARGV[at_id + 2] or ''
      if used ~= '' then
        usages[#usages + 1] = id
        usages[#usages + 1] = used
        local usage = cjson.decode(used)
        if usage['cached'] then
          cached = cached + 1
        else
          read = read + usage['prompt_tokens']
          wrote = wrote + usage['completion_tokens']
        end
      end
    end
  end
  hset_all(KEYS[1], pairs)
  hset_all(KEYS[9], usages)
  set_bits(KEYS[7], writes)
  written = #writes
end
if read + wrote > 0 then
  redis.call('HINCRBY', KEYS[2], 'prompt_tokens', read)
  redis.call('HINCRBY', KEYS[2], 'completion_tokens', wrote)
end
if cached > 0 then redis.call('HINCRBY', KEYS[2], 'cached', cached) end
if written > 0 then
  redis.call('HINCRBY', KEYS[2], 'inferred', written)
  touch(KEYS[2])
  mark_running(KEYS[3], status)
end
local reply = {written}
if written == n and at <= #ARGV then
  local given = nil
  if ARGV[at] == '=' then at, given = at + 1, ids end
  for _, count in ipairs(count_attempts(KEYS[5], KEYS[4], KEYS[6], at, given)) do
    reply[#reply + 1] = count
  end
end
return reply
