-- The usage inbox: append-only evidence; only acknowledged_at is ever set later.
-- No foreign key to executions: late evidence is accepted as reported and reconciled later.
CREATE TABLE usage_inbox (
    id                 uuid PRIMARY KEY,
    seq                bigserial NOT NULL UNIQUE,
    scope              text NOT NULL,
    execution_id       uuid NOT NULL,
    operation_key      text NOT NULL,
    provider_ref       text NULL,
    input_tokens       bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens      bigint NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens  bigint NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens bigint NOT NULL CHECK (cache_write_tokens >= 0),
    reasoning_tokens   bigint NOT NULL CHECK (reasoning_tokens >= 0),
    exact              boolean NOT NULL,
    source             text NOT NULL CHECK (source IN ('stream', 'late', 'operator')),
    received_at        timestamptz NOT NULL,
    acknowledged_at    timestamptz NULL
);

-- reconcile usage: a scope's open evidence, by cursor.
CREATE INDEX usage_inbox_open_idx
    ON usage_inbox (scope, seq)
    WHERE acknowledged_at IS NULL;
CREATE INDEX usage_inbox_execution_idx
    ON usage_inbox (execution_id, seq);
