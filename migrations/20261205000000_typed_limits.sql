-- What a call admitted under limits counted, for its end, as columns of its execution rather than
-- one document (spec/limits.md — What is stored): its subjects (`limit_subjects`, their stored
-- text), the tokens it counted (`limit_input_tokens`, `limit_output_tokens`) and its admission
-- time (`limit_admitted_at`), written with the row by the claim's insert. All four are NULL for a
-- call admitted under no limit, so its end touches no window; every one is set for a call under
-- limits. The claim and the end pass them as they are stored, with nothing to parse.
ALTER TABLE executions
    ADD COLUMN limit_subjects text[],
    ADD COLUMN limit_input_tokens tollgate_count,
    ADD COLUMN limit_output_tokens tollgate_count,
    ADD COLUMN limit_admitted_at timestamptz;

UPDATE executions SET
    limit_subjects = ARRAY(SELECT jsonb_array_elements_text(limits -> 'subjects')),
    limit_input_tokens = COALESCE((limits -> 'tokens' ->> 'input')::bigint, 0),
    limit_output_tokens = COALESCE((limits -> 'tokens' ->> 'output')::bigint, 0),
    limit_admitted_at = (limits ->> 'admitted_at')::timestamptz
WHERE limits IS NOT NULL;

ALTER TABLE executions DROP COLUMN limits;

ALTER TABLE executions ADD CONSTRAINT executions_limits_whole CHECK (
    (limit_subjects IS NULL AND limit_input_tokens IS NULL AND limit_output_tokens IS NULL
        AND limit_admitted_at IS NULL)
    OR (limit_subjects IS NOT NULL AND limit_input_tokens IS NOT NULL
        AND limit_output_tokens IS NOT NULL AND limit_admitted_at IS NOT NULL));
