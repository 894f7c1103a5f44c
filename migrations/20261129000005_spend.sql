-- Spend totals: settled charges and in-flight holds, per session and per day.
CREATE TABLE spend_sessions (
    scope      text NOT NULL,
    consumer   text NOT NULL,
    session_id text NOT NULL,
    settled    NUMERIC(38, 12) NOT NULL DEFAULT 0 CHECK (settled >= 0),
    held       NUMERIC(38, 12) NOT NULL DEFAULT 0 CHECK (held >= 0),
    PRIMARY KEY (scope, consumer, session_id)
);

CREATE TABLE spend_days (
    scope    text NOT NULL,
    consumer text NOT NULL,
    day      date NOT NULL,
    settled  NUMERIC(38, 12) NOT NULL DEFAULT 0 CHECK (settled >= 0),
    held     NUMERIC(38, 12) NOT NULL DEFAULT 0 CHECK (held >= 0),
    PRIMARY KEY (scope, consumer, day)
);
