-- The rate and concurrency limits of a stored API key (SC-220): `RateLimits` as JSON, NULL when
-- the key has none. Set when the key is created (`tollgate keys create --requests-per-minute …`).
ALTER TABLE api_keys ADD COLUMN limits jsonb;
