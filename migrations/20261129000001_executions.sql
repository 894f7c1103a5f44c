-- The journal: one row per (scope, operation_key) (spec/journal.md).
CREATE TABLE executions (
    id                   uuid PRIMARY KEY,
    scope                text NOT NULL,
    operation_key        text NOT NULL,
    kind                 text NOT NULL
        CHECK (kind IN ('text', 'json', 'structured', 'step')),
    root_key             text NULL,
    -- The serde JSON of `Binding` (session, intent, revision, config snapshot).
    binding              jsonb NOT NULL,
    binding_digest       text NOT NULL,
    accounting_day       date NOT NULL,
    state                text NOT NULL
        CHECK (state IN ('prepared', 'dispatched', 'completed', 'not_dispatched',
                         'reconciliation_required')),
    not_dispatched_cause text NULL
        CHECK (not_dispatched_cause IN ('invalid', 'input', 'aborted', 'audit', 'store',
                                        'expired')),
    outcome              text NULL
        CHECK (outcome IN ('success', 'invalid', 'refused', 'blocked', 'truncated',
                           'unavailable')),
    fence                bigint NOT NULL CHECK (fence >= 1),
    lease_expires_at     timestamptz NOT NULL,
    hold                 NUMERIC(38, 12) NOT NULL CHECK (hold >= 0),
    provider_ref         text NULL,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    CONSTRAINT executions_scope_operation_key_key UNIQUE (scope, operation_key),
    -- A cause exactly when not dispatched; an outcome exactly when completed.
    CONSTRAINT executions_cause_iff_not_dispatched
        CHECK ((state = 'not_dispatched') = (not_dispatched_cause IS NOT NULL)),
    CONSTRAINT executions_outcome_iff_completed
        CHECK ((state = 'completed') = (outcome IS NOT NULL))
);

-- reconcile expired: unfinished rows of a scope by lease end.
CREATE INDEX executions_scope_state_lease_idx
    ON executions (scope, state, lease_expires_at);
-- operator listings by state, oldest first.
CREATE INDEX executions_scope_state_created_idx
    ON executions (scope, state, created_at, id);
