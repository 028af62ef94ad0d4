-- Bearer tokens created with `switchyard-server token create`: only the
-- SHA-256 of each token is stored, never the token itself.
CREATE TABLE tokens (
    hash          TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    namespace     TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('agent', 'submitter', 'operator')),
    created_at_ms BIGINT NOT NULL,
    UNIQUE (namespace, name)
);
