#!/usr/bin/env python3
"""The database's ceiling for other shapes of a call's two transactions.

`db_only.sh` measures the shape the server sends today: each call's claim and settlement as one
statement and one commit each. This probe drives the same two functions with the same parameters
(`db_only.sql`) in other shapes, with pgbench and no application, on one freshly migrated
database, alternating the shapes round by round, and counts calls by the executions that reached
`completed` (so a call whose claim or settlement did not commit does not count):

  single       the shape of today: claim, then settlement, one statement and one commit each
  commit4      four calls' claims in one transaction (four statements, one commit), then their
               four settlements likewise
  statement4   four calls' claims in one statement and one commit, then their four settlements
  subtx4       as statement4, but each call in a subtransaction of its own and, after the first
               call, a lock timeout of 1 ms: a batch never waits for a lock while it holds
               another, so it cannot deadlock with any other transaction whatever order the
               other takes its locks in; a call that times out is left out of the batch (in a
               server it would run alone afterwards; here it is only counted as not completed)
  hot_settle   the shape of today on a second database where the executions' indexes that name
               the state are dropped and the table's fillfactor is 80, so that the settlement's
               update of the row is a HOT update (what those index entries cost)

Each pgbench client keeps one consumer (client id mod 8) unless `--random-consumers`; the audit
chain of each call is random over the 64 chains, and within a batch the chains ascend (the i-th
call of a batch takes one of chains 16i .. 16i + 15). Without that order, and with consumers
shared between clients, commit4 and statement4 deadlock within seconds: a batch that holds one
call's audit head or spend rows waits for another's, which the other batch holds while it waits
for the first. A server batching calls would need one global lock order across the calls of a
batch, or subtx4's rule. The helper functions of `subtx4` are created in
the probe's own database only; they are not part of tollgate's schema.

usage: benches/probe/db_shapes.py [--seconds 6] [--rounds 2] [--clients 8] [--random-consumers]
Needs: pgbench, psql, and a release build of tollgate (it runs `cargo build --release`).
Postgres at $PROBE_ADMIN_URL (default postgres://postgres@127.0.0.1:5432/postgres); uses the
databases `tollgate_shapes` and `tollgate_shapes_hot` (dropped and created again).
"""

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ADMIN = os.environ.get("PROBE_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
BASE = ADMIN.rsplit("/", 1)[0]
DATABASES = ("tollgate_shapes", "tollgate_shapes_hot")
BATCH = 4

HOT_SETTLE_SQL = """
DROP INDEX executions_state_scope_created_idx;
DROP INDEX executions_open_scope_idx;
DROP INDEX executions_scope_root_key_idx;
ALTER TABLE executions SET (fillfactor = 80);
"""


def psql(database, *commands, file=None):
    args = ["psql", f"{BASE}/{database}", "-qAt", "-v", "ON_ERROR_STOP=1"]
    for command in commands:
        args += ["-c", command]
    if file:
        args += ["-f", file]
    env = dict(os.environ, PGOPTIONS="-c client_min_messages=warning")
    return subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout


def statements():
    """The claim and the settlement of `db_only.sql`, without pgbench's variables."""
    lines = (HERE / "db_only.sql").read_text().splitlines()
    claim = next(line for line in lines if line.startswith("SELECT id AS eid FROM tollgate_claim"))
    settle = next(line for line in lines if line.startswith("SELECT id FROM tollgate_settle"))
    claim = claim[len("SELECT id AS eid FROM "):].replace("\\gset", "").strip()
    settle = settle[len("SELECT id FROM "):].strip().rstrip(";")
    for text, names in ((claim, (":n)", ":chain::", ":c)")), (settle, (":eid::", ":chain::", ":c)"))):
        for name in names:
            if name not in text:
                sys.exit(f"db_shapes: db_only.sql no longer has {name!r}; take the shapes again")
    return claim, settle


def with_vars(text, n, chain, eid, c=":c"):
    text = text.replace(":n)", f"{n})").replace(":chain::", f"{chain}::")
    text = text.replace(":eid::", f"{eid}::").replace(":c)", f"{c})")
    return text


def scripts(claim, settle, random_consumers):
    consumer = "\\set c random(0, 7)" if random_consumers else "\\set c :client_id % 8"
    head = [consumer]
    for i in range(BATCH):
        # Ascending chains: each batch takes the audit heads in one order (see the module's doc).
        span = 64 // BATCH
        head += [f"\\set n{i} random(1, 1000000000000)",
                 f"\\set chain{i} random({i * span}, {i * span + span - 1})"]
    single = [
        consumer,
        "\\set n random(1, 1000000000000)",
        "\\set chain random(0, 63)",
        f"SELECT id AS eid FROM {with_vars(claim, ':n', ':chain', ':eid')} \\gset",
        f"SELECT id FROM {with_vars(settle, ':n', ':chain', ':eid')};",
    ]
    commit4 = head + ["BEGIN;"]
    for i in range(BATCH):
        commit4.append(
            f"SELECT id AS eid{i} FROM {with_vars(claim, f':n{i}', f':chain{i}', '')} \\gset")
    commit4 += ["COMMIT;", "BEGIN;"]
    for i in range(BATCH):
        commit4.append(f"SELECT id FROM {with_vars(settle, '', f':chain{i}', f':eid{i}')};")
    commit4.append("COMMIT;")
    claims = ", ".join(
        f"(SELECT id FROM {with_vars(claim, f':n{i}', f':chain{i}', '')}) AS eid{i}"
        for i in range(BATCH))
    settles = ", ".join(
        f"(SELECT id FROM {with_vars(settle, '', f':chain{i}', f':eid{i}')}) AS s{i}"
        for i in range(BATCH))
    statement4 = head + [f"SELECT {claims} \\gset", f"SELECT {settles};"]
    ns = ", ".join(f":n{i}" for i in range(BATCH))
    chains = ", ".join(f":chain{i}" for i in range(BATCH))
    subtx4 = head + [
        f"SELECT shapes_claims(ARRAY[{ns}]::bigint[], ARRAY[{chains}]::int[], :c) AS e \\gset",
        f"SELECT shapes_settles(:e::uuid[], ARRAY[{chains}]::int[], :c);",
    ]
    return {"single": single, "commit4": commit4, "statement4": statement4, "subtx4": subtx4}


def batch_function(name, arguments, call):
    return f"""
CREATE FUNCTION {name}({arguments}) RETURNS uuid[] LANGUAGE plpgsql AS $fn$
DECLARE
    answered uuid[] := '{{}}';
    one uuid;
BEGIN
    FOR i IN 1..array_length(p_chain, 1) LOOP
        IF i = 2 THEN
            PERFORM set_config('lock_timeout', '1ms', true);
        END IF;
        BEGIN
            SELECT id INTO one FROM {call};
            answered := answered || one;
        EXCEPTION WHEN OTHERS THEN
            answered := answered || NULL::uuid;
        END;
    END LOOP;
    RETURN answered;
END
$fn$;
"""


def helper_functions(claim, settle):
    claims = batch_function(
        "shapes_claims", "p_n bigint[], p_chain int[], p_c int",
        with_vars(claim, "p_n[i]", "p_chain[i]", "", "p_c"))
    settles = batch_function(
        "shapes_settles", "p_e uuid[], p_chain int[], p_c int",
        with_vars(settle, "", "p_chain[i]", "p_e[i]", "p_c"))
    return claims + settles


def completed(database):
    return int(psql(database, "SELECT count(*) FROM executions WHERE state = 'completed'"))


def run(database, script, seconds, clients):
    before = completed(database)
    env = dict(os.environ, PGOPTIONS="-c client_min_messages=warning")
    out = subprocess.run(
        ["pgbench", "-n", "-M", "prepared", f"-c{clients}", "-j2", f"-T{seconds}", "-f", script,
         f"{BASE}/{database}"],
        capture_output=True, text=True, env=env)
    failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
    return (completed(database) - before) / seconds, failed.group(1) if failed else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--random-consumers", action="store_true")
    args = parser.parse_args()
    for tool in ("pgbench", "psql"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            sys.exit(f"db_shapes: {tool} is missing")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "tollgate", "--manifest-path",
                    str(ROOT / "Cargo.toml")], check=True)
    claim, settle = statements()
    try:
        for database in DATABASES:
            psql("postgres", f"DROP DATABASE IF EXISTS {database}", f"CREATE DATABASE {database}")
            subprocess.run([str(ROOT / "target/release/tollgate"), "migrate"], check=True,
                           capture_output=True, env=dict(os.environ,
                                                         DATABASE_URL=f"{BASE}/{database}"))
            # The probes' binding config, stored once as the server stores it (H-40).
            psql(database, file=str(HERE / "db_config.sql"))
        with tempfile.TemporaryDirectory() as work:
            helpers = pathlib.Path(work) / "helpers.sql"
            helpers.write_text(helper_functions(claim, settle))
            psql(DATABASES[0], file=str(helpers))
            hot = pathlib.Path(work) / "hot.sql"
            hot.write_text(HOT_SETTLE_SQL)
            psql(DATABASES[1], file=str(hot))
            files = {}
            for name, lines in scripts(claim, settle, args.random_consumers).items():
                files[name] = pathlib.Path(work) / f"{name}.sql"
                files[name].write_text("\n".join(lines) + "\n")
            shapes = [(name, DATABASES[0], files[name]) for name in files]
            shapes.append(("hot_settle", DATABASES[1], files["single"]))
            sums = {name: 0.0 for name, _, _ in shapes}
            for round_ in range(1, args.rounds + 1):
                order = shapes if round_ % 2 else list(reversed(shapes))
                for name, database, script in order:
                    rate, failed = run(database, str(script), args.seconds, args.clients)
                    sums[name] += rate
                    print(f"round {round_}: {name:<11} {rate:8.0f} completed calls/s "
                          f"(pgbench failed transactions: {failed})", flush=True)
            single = sums["single"]
            print(f"\nc{args.clients}, {args.rounds} round(s) of {args.seconds} s, "
                  f"{'random consumers' if args.random_consumers else 'a consumer per client'}")
            for name, _, _ in shapes:
                print(f"{name:<11} {sums[name] / args.rounds:8.0f} calls/s  "
                      f"{sums[name] / single:5.2f} x single")
    finally:
        for database in DATABASES:
            psql("postgres", f"DROP DATABASE IF EXISTS {database}")


if __name__ == "__main__":
    main()
