-- dispatch: keep broker queues as deep as the workers need, each refilled from the backlogs of
-- its own round by weighted fair queueing (fair_dispatch in the queue's prelude.lua: SFQ between
-- principals, turns within one). One call refills every queue its caller's worker consumes.
-- For queue i, with k = 10 * (i - 1) and a = 8 * (i - 1) + 1:
-- KEYS[k + 1] = the broker queue whose depth is kept (kombu's list: 'infer', 'score')
-- KEYS[k + 2] = its FairKeys.depth: a batch's worth of messages per live worker process
--               consuming it
-- KEYS[k + 3 .. k + 10] = its round's keys (fair_round in the queue's prelude.lua)
-- ARGV[1] = seconds a principal's turn serves one model
-- ARGV[a + 1] = depth: messages the queue should hold at least (its depth key's count when
--               greater)
-- ARGV[a + 2] = messages to move even if the queue is that deep already (a run just
--               submitted is one message from a worker, not the queue's depth: these go to
--               the queue's head)
-- ARGV[a + 3 .. a + 8] = its round's key templates (fair_round in the queue's prelude.lua)
-- Returns: messages moved, all queues together.
local moved = 0
for i = 1, #KEYS / 10 do
  local k, a = 10 * (i - 1), 8 * (i - 1) + 1
  moved = moved + fair_dispatch(fair_round(k + 3, a + 3), KEYS[k + 1], KEYS[k + 2],
    tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[1]))
end
return moved
