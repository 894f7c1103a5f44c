-- Operation roots (ST-5, ST-6, ST-7, ST-33): one row per (scope, root_key). The root row is
-- "the root lock": slot reservations, claims and settlements under the root lock it with
-- `SELECT ... FOR UPDATE`, always after the execution row and before the spend rows.
CREATE TABLE roots (
    id             uuid PRIMARY KEY,
    scope          text NOT NULL,
    root_key       text NOT NULL,
    -- The serde JSON of `Binding` (immutable; no deadline in it, SR-5).
    binding        jsonb NOT NULL,
    binding_digest text NOT NULL,
    deadline       timestamptz NOT NULL,
    state          text NOT NULL
        CHECK (state IN ('active', 'closed', 'expired', 'reconciled')),
    reserved_calls bigint NOT NULL DEFAULT 0 CHECK (reserved_calls >= 0),
    -- Inclusive charged cost: the sum of the root's receipts.
    charged        NUMERIC(38, 12) NOT NULL DEFAULT 0 CHECK (charged >= 0),
    -- Worst-case holds of the root's calls in flight.
    held           NUMERIC(38, 12) NOT NULL DEFAULT 0 CHECK (held >= 0),
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    CONSTRAINT roots_scope_root_key_key UNIQUE (scope, root_key)
);

-- reconcile roots: a scope's roots by state and deadline.
CREATE INDEX roots_scope_state_deadline_idx
    ON roots (scope, state, deadline);

-- Root receipts: each send under a root mirrors its governed charge on the root, exactly once
-- per execution, enforced by the schema (ST-6).
CREATE TABLE root_receipts (
    execution_id uuid NOT NULL REFERENCES executions (id),
    root_id      uuid NOT NULL REFERENCES roots (id),
    amount       NUMERIC(38, 12) NOT NULL CHECK (amount >= 0),
    currency     text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    created_at   timestamptz NOT NULL,
    CONSTRAINT root_receipts_pkey PRIMARY KEY (execution_id)
);

-- a root's receipts, oldest first.
CREATE INDEX root_receipts_root_idx
    ON root_receipts (root_id, created_at, execution_id);

-- reconcile roots: the calls under one root (to decide whether all of them are final).
CREATE INDEX executions_scope_root_key_idx
    ON executions (scope, root_key, state)
    WHERE root_key IS NOT NULL;
