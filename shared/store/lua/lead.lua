-- lead: take a lease when it is free or its holder is gone, or keep it when the caller holds it.
-- KEYS[1] = the lease: JANITOR (a worker's hostname) or RETENTION (a gateway
--           process's name)   string: the holder, expiring with the lease
-- ARGV[1] = the caller's name   ARGV[2] = lease length in milliseconds
-- ARGV[3] = the holder the caller saw without a live heartbeat ('' = none): taken over only if
--           it still holds the lease, so a holder that came back meanwhile keeps it
-- Returns: 1 if the caller holds the lease now, 0 if another holder has it.
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] or (ARGV[3] ~= '' and holder == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
