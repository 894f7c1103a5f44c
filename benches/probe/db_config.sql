-- The config of db_only.sql's and db_limited.sql's binding, stored once as the server stores it
-- before its first claim (spec/performance.md, H-40): the probes' claims name it by its digest.
INSERT INTO binding_configs (digest, config)
SELECT encode(sha256(convert_to(c, 'UTF8')), 'hex'), c::json
FROM (VALUES ('{"caps": {}, "kind": "text", "cache": null, "model": "mock-echo", "tools": [], "output": null, "prices": {"input": "1", "output": "2", "reasoning": "2", "cache_read": "0.1", "cache_write": "1.25"}, "system": null, "consumer": "team-3", "currency": "USD", "provider": "mock", "max_tokens": 64, "temperature": null, "tool_choice": null, "price_version": "prices-perf", "policy_version": "policy-1", "run_timeout_ms": 30000, "max_input_chars": 2000, "max_output_chars": 2000, "max_request_chars": null, "max_reasoning_chars": 100000, "context_window_tokens": null, "result_retention_secs": 2592000, "output_contract_version": "none", "max_consecutive_reasoning": null}')) AS v(c)
ON CONFLICT (digest) DO NOTHING;
