-- dispatch: keep broker queues as deep as the workers need, each refilled from the backlogs of
-- its own round by weighted fair queueing (fair_dispatch in prelude.lua: SFQ between
-- principals, turns within one). One call refills every queue its caller's worker consumes.
-- KEYS[2i-1] = queue i: the broker queue whose depth is kept (kombu's list: 'infer', 'score')
-- KEYS[2i]   = queue i's depth key (evalq:fair:depth, evalq:fair:score:depth): a batch's worth
--              of messages per live worker process consuming it
-- (the other keys are the dispatcher's, built by fair_keys() per principal served, and the
-- runs' backlogs, named by the round's backlog key prefix and suffix around a run's id)
-- ARGV[1] = samples a run is served in one turn of its principal's
-- ARGV[5i-3 .. 5i+1] = queue i's: depth (messages the queue should hold at least; its depth
--   key's count when greater), messages to move even if the queue is that deep already (a run
--   just submitted is one message from a worker, not the queue's depth: these go to the
--   queue's head), its round's prefix ('evalq:fair:', 'evalq:fair:score:'), the backlog key
--   prefix and suffix ('evalq:{', '}:backlog' / '}:score_backlog')
-- Returns: messages moved, all queues together.
local moved = 0
for i = 1, #KEYS / 2 do
  local a = 5 * (i - 1) + 1
  moved = moved + fair_dispatch(KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[a + 1]),
    tonumber(ARGV[a + 2]), ARGV[a + 3], tonumber(ARGV[1]), ARGV[a + 4], ARGV[a + 5])
end
return moved
