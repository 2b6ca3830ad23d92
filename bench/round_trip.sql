-- One round trip and as little server work as there is: bench.remote times it with pgbench.
SELECT 1;
