-- The far tier's table: messages due beyond the horizon, one row each, until a sweeper moves them into Redis.
-- {table} is replaced by the tier's table name (an identifier checked by FarTier). Run once per database, under
-- an advisory lock, by the first process that needs it; every statement is idempotent.
CREATE SEQUENCE IF NOT EXISTS {table}_token;

CREATE TABLE IF NOT EXISTS {table} (
    namespace text   NOT NULL,
    id        text   NOT NULL,
    due_ms    bigint NOT NULL,                              -- Redis clock, like the scores in Redis
    token     bigint NOT NULL DEFAULT nextval('{table}_token'), -- new for each version of the message
    route     text   NOT NULL,                              -- the envelope's route and name, for filters
    name      text   NOT NULL DEFAULT '',
    record    bytea  NOT NULL,                              -- the envelope exactly as Redis would hold it
    PRIMARY KEY (namespace, id)
);

CREATE INDEX IF NOT EXISTS {table}_due ON {table} (namespace, due_ms, token);
