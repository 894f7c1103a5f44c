-- A binding's config snapshot stored once (spec/performance.md, H-40). The config is most of a
-- binding (its versions, prices, caps, tools and limits: about 700 of a binding's 790 bytes) and
-- the same for every call of a profile, so an execution written by the claim function keeps the
-- rest of its binding in `binding` and names its config by `config_digest`, the SHA-256 (hex) of
-- the config's JSON text as stored here. The row is then a third of its size, at the claim's
-- insert and again as the settlement's new row version.
--
-- A row here is content-addressed: the CHECK recomputes the digest from the stored text (`json`
-- keeps the text as written), so a digest always names the config it was computed from. The
-- server writes a config by its own statement before the first claim that names it, and the claim
-- functions refuse to insert a row whose config is not stored, so no execution names a missing
-- config. Readers join the config back (`binding || {"config": …}`); a row without a digest
-- (written by the claim transaction, or before this migration) keeps its whole binding.
CREATE TABLE binding_configs (
    digest text PRIMARY KEY,
    config json NOT NULL,
    CONSTRAINT binding_configs_digest_of_config
        CHECK (digest = encode(sha256(convert_to(config::text, 'UTF8')), 'hex'))
);

ALTER TABLE executions ADD COLUMN config_digest text;

-- Immutable for the application: a digest names one config forever.
GRANT SELECT, INSERT ON binding_configs TO tollgate_app;
REVOKE UPDATE, DELETE, TRUNCATE ON binding_configs FROM tollgate_app;
