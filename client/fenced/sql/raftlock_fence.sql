-- raftlock fences for PostgreSQL — schema version 1.
--
-- Install, or upgrade an earlier version, as the role that is to own the
-- schema (tested with PostgreSQL 15):
--
--     psql -v ON_ERROR_STOP=1 -f raftlock_fence.sql "host=... dbname=..."
--
-- The file is idempotent: run again, it changes nothing. It runs as one
-- transaction: it installs everything or nothing.
--
-- Upgrade path: the installed version is what `raftlock.fence_schema_version()`
-- returns. Version N of this file holds the steps from 1 up to N and runs
-- only those above the installed version, so running the newest file
-- upgrades any earlier installation in place and keeps every remembered
-- fence. It never downgrades: run against a newer installed version it
-- stops with SQLSTATE 55000 and changes nothing.
--
-- What it creates:
--
--   raftlock.fences (resource text primary key, fence bigint)
--       the largest fence accepted so far for each resource.
--   raftlock.check_fence(resource text, fence bigint) returns void
--       call it FIRST in the transaction that writes what the lock
--       protects. It locks the resource's row of raftlock.fences until
--       that transaction ends, then:
--         * fence larger than the remembered one (or none remembered):
--           records it, returns;
--         * fence equal to it: returns (the same holder writing again);
--         * fence smaller: raises SQLSTATE RL001 ("stale fence ..."); the
--           transaction is aborted and nothing it wrote is kept. The
--           DETAIL field reads exactly "latest accepted fence: N".
--       Bad input raises 22004 (a null argument) or 22023 (a resource
--       that is not 1 to 512 bytes, a fence below 1) and changes nothing.
--       Works at every isolation level; at REPEATABLE READ and
--       SERIALIZABLE a concurrent check of the same resource can abort the
--       transaction with 40001, to be retried as usual.
--   raftlock.fence_schema_version() returns integer
--       the installed version (1).
--
-- Fences are bigint: 1 to 9223372036854775807 (2^63 - 1). raftlock's
-- server hands out fences from 1 and never above 2^63 - 1 (its documented
-- fence bound), so every fence it grants fits.
--
-- check_fence runs with its owner's rights (SECURITY DEFINER, with a fixed
-- search_path), so other roles need no rights on the table, only:
--
--     GRANT USAGE ON SCHEMA raftlock TO app;
--     GRANT EXECUTE ON FUNCTION raftlock.check_fence(text, bigint) TO app;
--
-- Never delete a row of raftlock.fences while a holder of that lock may
-- still write: the next fence, however old, would be accepted. After a
-- raftlock cluster is rebuilt without a backup (its fences start again at
-- 1), delete the rows of its locks, once no old holder can write.

BEGIN;

-- Two installers at once take turns (the key is "raftlock" in ASCII).
SELECT pg_advisory_xact_lock(8241981443286197099);

CREATE SCHEMA IF NOT EXISTS raftlock;

DO $install$
DECLARE
    installed integer := 0;
    this_file constant integer := 1;
BEGIN
    IF to_regprocedure('raftlock.fence_schema_version()') IS NOT NULL THEN
        EXECUTE 'SELECT raftlock.fence_schema_version()' INTO installed;
    END IF;
    IF installed > this_file THEN
        RAISE EXCEPTION 'raftlock fence schema version % is installed, newer than this file (version %); nothing changed',
            installed, this_file
            USING ERRCODE = '55000',
                  HINT = 'Use the raftlock_fence.sql of the newer raftlock release.';
    END IF;

    -- Step 1: the table and the check.
    IF installed < 1 THEN
        CREATE TABLE raftlock.fences (
            resource text PRIMARY KEY
                CONSTRAINT fences_resource_length CHECK (octet_length(resource) BETWEEN 1 AND 512),
            fence bigint NOT NULL
                CONSTRAINT fences_fence_positive CHECK (fence >= 1)
        );
        COMMENT ON TABLE raftlock.fences IS
            'raftlock: the largest fence accepted per resource (see raftlock.check_fence)';

        CREATE FUNCTION raftlock.check_fence(resource text, fence bigint)
        RETURNS void
        LANGUAGE plpgsql
        SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $check$
        DECLARE
            accepted bigint;
            latest bigint;
        BEGIN
            IF check_fence.resource IS NULL OR check_fence.fence IS NULL THEN
                RAISE EXCEPTION 'raftlock.check_fence: resource and fence must not be null'
                    USING ERRCODE = '22004';
            END IF;
            IF octet_length(check_fence.resource) NOT BETWEEN 1 AND 512 THEN
                RAISE EXCEPTION 'raftlock.check_fence: a resource is 1 to 512 bytes, this one is %',
                    octet_length(check_fence.resource)
                    USING ERRCODE = '22023';
            END IF;
            IF check_fence.fence < 1 THEN
                RAISE EXCEPTION 'raftlock.check_fence: fences start at 1, got %', check_fence.fence
                    USING ERRCODE = '22023';
            END IF;
            -- Inserts the first fence, or raises a smaller-or-equal one to
            -- this fence. Either way the row stays locked until the
            -- caller's transaction ends (ON CONFLICT DO UPDATE locks the
            -- row even when its WHERE is false), so no other holder's
            -- check and write can come between this check and the
            -- caller's writes.
            INSERT INTO raftlock.fences AS f (resource, fence)
                VALUES (check_fence.resource, check_fence.fence)
            ON CONFLICT ON CONSTRAINT fences_pkey
                DO UPDATE SET fence = excluded.fence WHERE f.fence <= excluded.fence
            RETURNING f.fence INTO accepted;
            IF accepted IS NULL THEN
                SELECT f.fence INTO latest FROM raftlock.fences AS f
                    WHERE f.resource = check_fence.resource;
                RAISE EXCEPTION 'stale fence % for resource %: fence % was already accepted',
                    check_fence.fence, quote_literal(check_fence.resource), latest
                    USING ERRCODE = 'RL001',
                          DETAIL = format('latest accepted fence: %s', latest),
                          HINT = 'This holder lost the lock and a newer holder has written; '
                              'give up this work (retrying with the same fence is refused again).';
            END IF;
        END
        $check$;
        COMMENT ON FUNCTION raftlock.check_fence(text, bigint) IS
            'raftlock: refuse (SQLSTATE RL001) a fence smaller than the largest accepted for the resource; call first in the writing transaction';
        REVOKE ALL ON FUNCTION raftlock.check_fence(text, bigint) FROM PUBLIC;
    END IF;

    -- Later versions add their steps here: IF installed < 2 THEN ... END IF;

    CREATE OR REPLACE FUNCTION raftlock.fence_schema_version()
    RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 1';
END
$install$;

COMMIT;
