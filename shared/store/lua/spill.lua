-- spill: a going run's segment of settled samples moved to a Parquet part: free its per-sample
-- results and mark its samples spilled, once.
-- KEYS[1] = RunKeys.meta     hash: reads 'status' and 'finalizing'
-- KEYS[2] = RunKeys.spill    hash: 'rows' -> samples per segment, 'samples' -> samples
--                                spilled; segment -> part URL
-- KEYS[3] = RunKeys.spilled  bitmap: bit i set for each spilled sample i
-- KEYS[4] = RunKeys.out, KEYS[5] = RunKeys.score, KEYS[6] = RunKeys.err   hashes
-- KEYS[7] = RunKeys.errors   hash: stage/kind -> terminal errors moved to parts
-- KEYS[8] = RunKeys.inferred, KEYS[9] = RunKeys.done   bitmaps: samples with an output,
--           samples settled
-- KEYS[10] = RunKeys.ranges_of('outputs'), KEYS[11] = RunKeys.ranges_of('scores')   the
--           spans in KEYS[4] and KEYS[5]: one is deleted once all its samples are spilled
-- KEYS[12] = RunKeys.usage, KEYS[13] = RunKeys.grade   hashes (one field per sample, as
--           KEYS[6])
-- ARGV[1] = segment index, ARGV[2] = samples per segment, ARGV[3] = the part's URL,
-- ARGV[4] = how many kind/count pairs follow ARGV[5], ARGV[5] = the most samples a span holds
-- (evalq.shared.store.wire.SPAN_MAX); then kind1, count1, ...; then how many ids follow that
-- the part holds no output for, then those ids; then the segment's ids, or -n and lo for the
-- n samples lo, lo + 1, ... (a segment of consecutive ids: no per-sample work below)
-- Returns: 1 spilled now; 2 spilled before with this very part (a retried call whose first
-- reply was lost); 0 spilled before with another part (the caller removes its own);
-- -1 the run is not going, or is being finalized (its finalizer reads the store: nothing may
-- move under it); -2 the part is not the store's: a sample of the segment is not settled, one
-- the part holds no output for has one now (a late attempt's), or the segment size is not
-- the run's.
local status = redis.call('HGET', KEYS[1], 'status')
if (not going(status))
  or redis.call('HEXISTS', KEYS[1], 'finalizing') == 1 then
  return -1
end
local had = redis.call('HGET', KEYS[2], ARGV[1])
if had == ARGV[3] then return 2 end
if had then return 0 end
local rows = redis.call('HGET', KEYS[2], 'rows')
if rows and rows ~= ARGV[2] then return -2 end
local at = 6 + 2 * tonumber(ARGV[4])
local bare = {}
for i = at + 1, at + tonumber(ARGV[at]) do bare[#bare + 1] = ARGV[i] end
if next(bits_of(KEYS[8], bare)) then return -2 end
local first = at + tonumber(ARGV[at]) + 1
local ids, low, high, n = {}, 0, 0, 0
if tonumber(ARGV[first]) < 0 then -- lo, lo + 1, ...: made only where a sample is named
  n, low = -tonumber(ARGV[first]), tonumber(ARGV[first + 1])
  high = low + n - 1
  if redis.call('BITCOUNT', KEYS[9], low, high, 'BIT') ~= n then return -2 end
  set_range(KEYS[3], low, high)
else
  for i = first, #ARGV do ids[#ids + 1] = ARGV[i] end
  n = #ids
  if count_bits(KEYS[9], ids) ~= n then return -2 end
  set_bits(KEYS[3], ids)
  low, high = bounds(ids)
end
local consecutive = #ids == 0
-- Free the segment's spans all of whose samples are spilled now; return those of its samples
-- no span holds (held one by one, if at all).
local function free(hash, ranges)
  local spans = {}
  for _, field in ipairs(redis.call('ZRANGEBYSCORE', ranges, low - tonumber(ARGV[5]) + 1, high)) do
    local lo, hi = string.match(field, '^(%d+)-(%d+)$')
    lo, hi = tonumber(lo), tonumber(hi)
    if hi >= low then
      spans[#spans + 1] = {lo, hi}
      if redis.call('BITCOUNT', KEYS[3], lo, hi, 'BIT') == hi - lo + 1 then
        redis.call('HDEL', hash, field)
        redis.call('ZREM', ranges, field)
      end
    end
  end
  local single = {}
  if consecutive then -- the gaps between the spans (listed by lo, none overlapping)
    local next_id = low
    for _, span in ipairs(spans) do
      for i = next_id, math.min(span[1] - 1, high) do single[#single + 1] = i end
      next_id = math.max(next_id, span[2] + 1)
    end
    for i = next_id, high do single[#single + 1] = i end
    return single
  end
  local spanned = {}
  for _, span in ipairs(spans) do
    for i = math.max(span[1], low), math.min(span[2], high) do spanned[i] = true end
  end
  for _, id in ipairs(ids) do
    if not spanned[tonumber(id)] then single[#single + 1] = id end
  end
  return single
end
hdel_all({KEYS[4]}, free(KEYS[4], KEYS[10]))
hdel_all({KEYS[5]}, free(KEYS[5], KEYS[11]))
local held = nil -- the segment's ids, made once if a per-sample hash holds any
for _, key in ipairs({KEYS[6], KEYS[12], KEYS[13]}) do
  if redis.call('EXISTS', key) == 1 then
    held = held or (consecutive and span_ids(low, n) or ids)
    hdel_all({key}, held)
  end
end
for i = 6, at - 1, 2 do redis.call('HINCRBY', KEYS[7], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[2], 'rows', ARGV[2], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], 'samples', n)
return 1
