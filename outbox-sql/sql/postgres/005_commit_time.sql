-- The commit time of each row, for the commit-to-publish latency. Writers pay nothing: the
-- relay's first claim of a row stamps it from PostgreSQL's commit timestamp of the
-- inserting transaction (`pg_xact_commit_timestamp(xmin)`), which the server keeps only
-- with `track_commit_timestamp = on`. Without it the column stays NULL and the latency is
-- measured from `created_at`, the transaction's start, and labelled so.
ALTER TABLE {outbox} ADD COLUMN IF NOT EXISTS committed_at timestamptz;
