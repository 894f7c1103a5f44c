-- Governed charges: exactly one per execution, enforced by the schema (SC-52).
CREATE TABLE cost_settlements (
    settlement_id      uuid PRIMARY KEY,
    -- Settlement (insertion) order.
    seq                bigserial NOT NULL UNIQUE,
    execution_id       uuid NOT NULL REFERENCES executions (id),
    scope              text NOT NULL,
    operation_key      text NOT NULL,
    kind               text NOT NULL CHECK (kind IN ('text', 'json', 'structured', 'step')),
    consumer           text NOT NULL,
    session_id         text NOT NULL,
    accounting_day     date NOT NULL,
    provider           text NOT NULL,
    model              text NOT NULL,
    price_version      text NOT NULL,
    policy_version     text NOT NULL,
    currency           text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    input_tokens       bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens      bigint NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens  bigint NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens bigint NOT NULL CHECK (cache_write_tokens >= 0),
    reasoning_tokens   bigint NOT NULL CHECK (reasoning_tokens >= 0),
    amount             NUMERIC(38, 12) NOT NULL CHECK (amount >= 0),
    source             text NOT NULL CHECK (source IN ('stream', 'recovery', 'operator')),
    settled_at         timestamptz NOT NULL,
    CONSTRAINT cost_settlements_execution_id_key UNIQUE (execution_id)
);

-- finance export by accounting day, in settlement order.
CREATE INDEX cost_settlements_day_idx
    ON cost_settlements (accounting_day, seq);
