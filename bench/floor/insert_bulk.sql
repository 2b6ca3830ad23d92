-- :chunk jobs in one statement.
INSERT INTO floor_job (payload)
SELECT jsonb_build_object('n', g) FROM generate_series(1, :chunk) AS g;
