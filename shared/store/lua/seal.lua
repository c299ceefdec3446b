-- seal: make one archive attempt's folder the run's archive and free the run's per-sample
-- state, once.
-- KEYS[1] = RunKeys.meta   hash: reads 'status'; sets 'archive_url' and 'archived'
-- KEYS[2] = RunKeys.progress  hash: reads 'scored', 'failed', 'inferred'
-- KEYS[3] = RunKeys.errors    hash: stage/kind -> count, written here (status reads it)
-- KEYS[4..] = the run's per-sample keys (RunKeys.per_sample): unlinked
-- ARGV[1] = the attempt folder's URL (its manifest is written)
-- ARGV[2] = the run's sample count, from its facts (read only for workers: not a key here)
-- ARGV[3] = the rows that attempt wrote; ARGV[4] = the scores, ARGV[5] = the errors, ARGV[6] =
--           the outputs it found; ARGV[7..] = kind1, count1, kind2, count2, ... of its errors
-- Returns: 1 sealed now; 2 sealed before with this very folder (this call is a retry whose first
-- reply was lost); 0 sealed before with another attempt's folder; -1 the run is going (or has
-- no record); -2 the attempt's counts disagree with the run's (it read the store while another
-- attempt was freeing it): it must not win.
local status = redis.call('HGET', KEYS[1], 'status')
if status == false or going(status) then return -1 end
local sealed = redis.call('HGET', KEYS[1], 'archive_url')
if sealed == ARGV[1] then return 2 end
if sealed then return 0 end
local n = tonumber(ARGV[2])
local scored = tonumber(redis.call('HGET', KEYS[2], 'scored') or '0')
local failed = tonumber(redis.call('HGET', KEYS[2], 'failed') or '0')
local inferred = tonumber(redis.call('HGET', KEYS[2], 'inferred') or '0')
if tonumber(ARGV[3]) ~= n or tonumber(ARGV[4]) ~= scored or tonumber(ARGV[5]) ~= failed
  or tonumber(ARGV[6]) ~= inferred then
  return -2
end
redis.call('HSET', KEYS[1], 'archive_url', ARGV[1], 'archived', string.format('%.6f', now()))
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
for i = 4, #KEYS do redis.call('UNLINK', KEYS[i]) end
return 1
