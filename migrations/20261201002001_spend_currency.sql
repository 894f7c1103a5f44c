-- Spend is kept per currency (spec/money.md — Caps, SC-105): a consumer charged through a USD
-- and an EUR profile has one session row and one day row in each currency, and a cap (in its
-- snapshot's currency) counts only the rows in that currency. `currency` joins the primary key.
--
-- Existing rows get the currency of what fed them: the settlements charged to the row and the
-- executions whose snapshot counts against it (consumer and session, or consumer and accounting
-- day, from the binding; their snapshot currency).
-- - A row fed in one currency keeps its totals (as stored, so the ledger audit still reports a
--   row that was damaged) and takes that currency.
-- - A row fed in several currencies added up amounts that cannot be added up; it is replaced by
--   one row per currency holding what that currency's settlements and open holds add up to
--   (what the ledger audit checks the rows against).
-- - A row that nothing names (no settlement, no execution: only written by hand) takes `USD`,
--   the currency of the price tables the service ships (`tollgate serve` without a config file);
--   the database cannot read a deployment's configuration, and the ledger audit reports such a
--   row if its totals are not zero.
CREATE TEMPORARY TABLE spend_feed ON COMMIT DROP AS
SELECT scope, consumer, session_id, accounting_day AS day, currency,
       amount AS settled, 0::numeric(38, 12) AS held
FROM cost_settlements
UNION ALL
SELECT scope, binding->'config'->>'consumer', binding->>'session_id', accounting_day,
       binding->'config'->>'currency', 0::numeric(38, 12), hold
FROM executions;

-- Sessions.
ALTER TABLE spend_sessions ADD COLUMN currency text;
ALTER TABLE spend_sessions DROP CONSTRAINT spend_sessions_pkey;

CREATE TEMPORARY TABLE session_currencies ON COMMIT DROP AS
SELECT scope, consumer, session_id, min(currency) AS currency,
       count(DISTINCT currency) AS currencies
FROM spend_feed GROUP BY scope, consumer, session_id;

UPDATE spend_sessions s SET currency = c.currency
FROM session_currencies c
WHERE c.currencies = 1
  AND s.scope = c.scope AND s.consumer = c.consumer AND s.session_id = c.session_id;

INSERT INTO spend_sessions (scope, consumer, session_id, currency, settled, held)
SELECT f.scope, f.consumer, f.session_id, f.currency, sum(f.settled), sum(f.held)
FROM spend_feed f
JOIN session_currencies c
  ON c.scope = f.scope AND c.consumer = f.consumer AND c.session_id = f.session_id
WHERE c.currencies > 1
GROUP BY f.scope, f.consumer, f.session_id, f.currency;

DELETE FROM spend_sessions s
USING session_currencies c
WHERE s.currency IS NULL AND c.currencies > 1
  AND s.scope = c.scope AND s.consumer = c.consumer AND s.session_id = c.session_id;

UPDATE spend_sessions SET currency = 'USD' WHERE currency IS NULL;

ALTER TABLE spend_sessions
    ALTER COLUMN currency SET NOT NULL,
    ADD CONSTRAINT spend_sessions_currency_check CHECK (currency ~ '^[A-Z]{3}$'),
    ADD CONSTRAINT spend_sessions_pkey PRIMARY KEY (scope, consumer, session_id, currency);

-- Days.
ALTER TABLE spend_days ADD COLUMN currency text;
ALTER TABLE spend_days DROP CONSTRAINT spend_days_pkey;

CREATE TEMPORARY TABLE day_currencies ON COMMIT DROP AS
SELECT scope, consumer, day, min(currency) AS currency, count(DISTINCT currency) AS currencies
FROM spend_feed GROUP BY scope, consumer, day;

UPDATE spend_days s SET currency = c.currency
FROM day_currencies c
WHERE c.currencies = 1
  AND s.scope = c.scope AND s.consumer = c.consumer AND s.day = c.day;

INSERT INTO spend_days (scope, consumer, day, currency, settled, held)
SELECT f.scope, f.consumer, f.day, f.currency, sum(f.settled), sum(f.held)
FROM spend_feed f
JOIN day_currencies c ON c.scope = f.scope AND c.consumer = f.consumer AND c.day = f.day
WHERE c.currencies > 1
GROUP BY f.scope, f.consumer, f.day, f.currency;

DELETE FROM spend_days s
USING day_currencies c
WHERE s.currency IS NULL AND c.currencies > 1
  AND s.scope = c.scope AND s.consumer = c.consumer AND s.day = c.day;

UPDATE spend_days SET currency = 'USD' WHERE currency IS NULL;

ALTER TABLE spend_days
    ALTER COLUMN currency SET NOT NULL,
    ADD CONSTRAINT spend_days_currency_check CHECK (currency ~ '^[A-Z]{3}$'),
    ADD CONSTRAINT spend_days_pkey PRIMARY KEY (scope, consumer, day, currency);
