-- recover: count samples the janitor sent again, and stamp the run as touched, so that it is
-- not counted stalled again before those messages had their chance.
-- KEYS[1] = RunKeys.progress  hash: 'recovered' bumped, 'touched' stamped
-- ARGV[1] = samples sent again
-- Returns: the run's recovered count.
local total = redis.call('HINCRBY', KEYS[1], 'recovered', ARGV[1])
touch(KEYS[1])
return total
