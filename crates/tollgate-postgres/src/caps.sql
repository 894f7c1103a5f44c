-- The cap rule, once for every function: whether `p_spent` crosses a cap of `p_level` at `p_cap`.
-- A warn cap is crossed at `spent >= cap`, a block cap at `spent > cap`; no cap (NULL) is never
-- crossed. It is the rule of `tollgate_core::caps` (`Caps::admit`, `Caps::after_settle`), and a
-- test compares the two on its boundary cases. A plain SQL expression, so the planner inlines it
-- where a function uses it.
CREATE OR REPLACE FUNCTION tollgate_cap_crossed(p_level text, p_spent numeric, p_cap numeric)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_cap IS NOT NULL
        AND CASE p_level WHEN 'warn' THEN p_spent >= p_cap WHEN 'block' THEN p_spent > p_cap END
$$;

-- The post-call caps crossed by settled totals, in the order of the cap rules: the session's
-- warn then block, then the day's. The entries are the warnings a settlement stores, in the form
-- of `CapWarning`.
CREATE OR REPLACE FUNCTION tollgate_crossed(
    session_settled numeric,
    day_settled numeric,
    session_warn numeric,
    session_block numeric,
    daily_warn numeric,
    daily_block numeric
) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    crossed jsonb := '[]'::jsonb;
BEGIN
    IF tollgate_cap_crossed('warn', session_settled, session_warn) THEN
        crossed := crossed || jsonb_build_object('cap', 'session', 'level', 'warn',
            'limit', session_warn::text, 'spent', trim_scale(session_settled)::text);
    END IF;
    IF tollgate_cap_crossed('block', session_settled, session_block) THEN
        crossed := crossed || jsonb_build_object('cap', 'session', 'level', 'block',
            'limit', session_block::text, 'spent', trim_scale(session_settled)::text);
    END IF;
    IF tollgate_cap_crossed('warn', day_settled, daily_warn) THEN
        crossed := crossed || jsonb_build_object('cap', 'daily', 'level', 'warn',
            'limit', daily_warn::text, 'spent', trim_scale(day_settled)::text);
    END IF;
    IF tollgate_cap_crossed('block', day_settled, daily_block) THEN
        crossed := crossed || jsonb_build_object('cap', 'daily', 'level', 'block',
            'limit', daily_block::text, 'spent', trim_scale(day_settled)::text);
    END IF;
    RETURN crossed;
END
$$;
