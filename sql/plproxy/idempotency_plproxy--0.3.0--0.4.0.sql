-- idempotency_plproxy 0.3.0 to 0.4.0
--
-- Every change of the proxy's functions between the two versions is made
-- here too, so that an updated proxy database equals a fresh install.

\echo Use "ALTER EXTENSION idempotency_plproxy UPDATE TO '0.4.0'" to load this file. \quit
