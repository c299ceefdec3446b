-- lead: take the janitor's lease when it is free, or keep it when this worker holds it.
-- KEYS[1] = evalq:janitor  string: the leader's hostname, expiring with the lease
-- ARGV[1] = this worker's hostname   ARGV[2] = lease length in milliseconds
-- Returns: 1 if this worker leads now, 0 if another worker holds the lease.
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
