-- spill: a going run's segment of settled samples moved to a Parquet part: free its per-sample
-- results and mark its samples spilled, once.
-- KEYS[1] = RunKeys.meta     hash: reads 'status' and 'finalizing'
-- KEYS[2] = RunKeys.spill    hash: 'rows' -> samples per segment, 'samples' -> samples
--                                spilled; segment -> part URL
-- KEYS[3] = RunKeys.spilled  bitmap: bit i set for each spilled sample i
-- KEYS[4] = RunKeys.out, KEYS[5] = RunKeys.score, KEYS[6] = RunKeys.err   hashes
-- KEYS[7] = RunKeys.errors   hash: stage/kind -> terminal errors moved to parts
-- ARGV[1] = segment index, ARGV[2] = samples per segment, ARGV[3] = the part's URL,
-- ARGV[4] = how many kind/count pairs follow, then kind1, count1, ...; then how many ids
-- follow that the part holds no output for, then those ids; then the segment's ids
-- Returns: 1 spilled now; 2 spilled before with this very part (a retried call whose first
-- reply was lost); 0 spilled before with another part (the caller removes its own);
-- -1 the run is not going, or is being finalized (its finalizer reads the store: nothing may
-- move under it); -2 the part is not the store's: a sample of the segment is not settled, one
-- the part holds no output for has one now (a late attempt's), or the segment size is not
-- the run's.
local status = redis.call('HGET', KEYS[1], 'status')
if (status ~= 'queued' and status ~= 'running')
  or redis.call('HEXISTS', KEYS[1], 'finalizing') == 1 then
  return -1
end
local had = redis.call('HGET', KEYS[2], ARGV[1])
if had == ARGV[3] then return 2 end
if had then return 0 end
local rows = redis.call('HGET', KEYS[2], 'rows')
if rows and rows ~= ARGV[2] then return -2 end
local at = 5 + 2 * tonumber(ARGV[4])
local bare = {}
for i = at + 1, at + tonumber(ARGV[at]) do bare[#bare + 1] = ARGV[i] end
for _, output in ipairs(hmget_all(KEYS[4], bare)) do
  if output then return -2 end
end
local ids = {}
for i = at + tonumber(ARGV[at]) + 1, #ARGV do ids[#ids + 1] = ARGV[i] end
local errs = redis.call('EXISTS', KEYS[6]) == 1 -- no sample has an error: nothing to read
local scores, errors = hmget_all(KEYS[5], ids), errs and hmget_all(KEYS[6], ids) or {}
for j = 1, #ids do
  if not scores[j] and not errors[j] then return -2 end
end
set_bits(KEYS[3], ids)
hdel_all(errs and {KEYS[4], KEYS[5], KEYS[6]} or {KEYS[4], KEYS[5]}, ids)
for i = 5, at - 1, 2 do redis.call('HINCRBY', KEYS[7], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[2], 'rows', ARGV[2], ARGV[1], ARGV[3])
redis.call('HINCRBY', KEYS[2], 'samples', #ids)
return 1
