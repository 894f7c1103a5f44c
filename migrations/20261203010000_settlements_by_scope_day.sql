-- The finance console reads one scope's settlements of a range of accounting days, by day and
-- then settlement order, with a limit (spec/service.md — Console, SC-192). Led by the scope, the
-- index yields exactly those rows in that order, so the limit ends the scan and no other scope's
-- rows are read or counted. It replaces the index of the same name on `(accounting_day, seq)`,
-- which only a read across scopes used, so a settlement still inserts one entry into it.
DROP INDEX cost_settlements_day_idx;
CREATE INDEX cost_settlements_day_idx ON cost_settlements (scope, accounting_day, seq);
