-- Results under retention: one row per settled execution.
-- `output` and `step` are `json`, not `jsonb`: content is kept byte-for-byte as serialized
-- (key order, `\u0000` escapes, number spelling), and it is never queried into.
CREATE TABLE execution_results (
    execution_id         uuid PRIMARY KEY REFERENCES executions (id),
    outcome              text NOT NULL
        CHECK (outcome IN ('success', 'invalid', 'refused', 'blocked', 'truncated',
                           'unavailable')),
    stop                 text NULL,
    output               json NULL,
    step                 json NULL,
    warnings             jsonb NOT NULL DEFAULT '[]'::jsonb,
    retention_expires_at timestamptz NOT NULL,
    erased_at            timestamptz NULL,
    -- Erased content stays erased (SC-73).
    CONSTRAINT execution_results_erased_has_no_content
        CHECK (erased_at IS NULL OR (output IS NULL AND step IS NULL))
);

-- retention erasure scans only what is still to erase.
CREATE INDEX execution_results_retention_idx
    ON execution_results (retention_expires_at)
    WHERE erased_at IS NULL;
