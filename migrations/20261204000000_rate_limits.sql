-- Rate and concurrency limits (spec/limits.md, SC-220..SC-223): each limited subject's window of
-- one minute and its calls in flight, per scope. The subject is its stored form
-- (`consumer:<id>` or `key:<sha-256 hex>`). A window opens at the subject's first admission after
-- the previous one closed (`started_at`) and counts the requests and tokens admitted in it;
-- `in_flight` is not windowed. The claim admits in its own unit (`tollgate_limits_admit`,
-- limits.sql), and a call's end gives back or corrects what it counted (`tollgate_limits_end`).
-- The counts are `tollgate_count` (bigint, never negative) as every count a call writes (H-25).
CREATE TABLE limit_windows (
    scope         text NOT NULL,
    subject       text NOT NULL,
    started_at    timestamptz NOT NULL,
    requests      tollgate_count NOT NULL DEFAULT 0,
    input_tokens  tollgate_count NOT NULL DEFAULT 0,
    output_tokens tollgate_count NOT NULL DEFAULT 0,
    in_flight     tollgate_count NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, subject)
);

-- What a call admitted under limits counted, for its end: its subjects, its tokens and its
-- admission time (`{"subjects": […], "tokens": {"input": …, "output": …}, "admitted_at": …}`),
-- written with the row by the claim's insert; its end changes each subject's window that contains
-- the admission time. NULL when the call was admitted under no limit, so its end touches no
-- window.
ALTER TABLE executions ADD COLUMN limits jsonb;

-- The call path reads, inserts and updates the windows, as it does the spend rows.
GRANT SELECT, INSERT, UPDATE ON limit_windows TO tollgate_app;
