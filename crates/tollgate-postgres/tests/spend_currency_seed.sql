-- Spend rows as they were before spend was kept per currency (see the SC-105 migration test).
CREATE TEMP TABLE ex(k text, consumer text, sess text, cur text, state text, hold numeric, amount numeric);
INSERT INTO ex VALUES ('e1','team-a','s-1','USD','completed',0,0.3),('e2','team-a','s-1','EUR','completed',0,0.2),
 ('e3','team-a','s-1','EUR','dispatched',0.5,NULL),('e4','team-b','s-2','USD','dispatched',0.1,NULL);
INSERT INTO executions (id, scope, operation_key, kind, binding, binding_digest, accounting_day, state, outcome, fence, lease_expires_at, hold, created_at, updated_at)
SELECT gen_random_uuid(), 'a', k, 'text', jsonb_build_object('session_id', sess, 'config', jsonb_build_object('consumer', consumer, 'currency', cur)), 'x', '2026-11-29', state,
  CASE WHEN state='completed' THEN 'success' END, 1, now(), hold, now(), now() FROM ex;
INSERT INTO cost_settlements (settlement_id, execution_id, scope, operation_key, kind, consumer, session_id, accounting_day, provider, model, price_version, policy_version, currency, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, amount, source, settled_at)
SELECT gen_random_uuid(), e.id, 'a', ex.k, 'text', ex.consumer, ex.sess, '2026-11-29', 'mock', 'm', 'p', 'p', ex.cur, 0,0,0,0,0, ex.amount, 'stream', now()
FROM ex JOIN executions e ON e.operation_key = ex.k WHERE ex.amount IS NOT NULL;
INSERT INTO spend_sessions VALUES ('a','team-a','s-1',0.5,0.5),('a','team-b','s-2',0,0.1),('a','team-c','s-3',0,0);
INSERT INTO spend_days VALUES ('a','team-a','2026-11-29',0.5,0.5),('a','team-b','2026-11-29',0,0.1);
