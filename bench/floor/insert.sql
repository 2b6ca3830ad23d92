-- One job in its own transaction, the shape of an enqueue in the caller's transaction.
BEGIN;
INSERT INTO floor_job (payload) VALUES ('{"n": 1}');
END;
