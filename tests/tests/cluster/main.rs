//! Cluster integration tests: real raftlock nodes on loopback ports, one
//! test binary (linked once) with a module per area, numbered in the order
//! they build on each other (as in openraft's own test suites).

// Two suites that start clusters too, in this binary so that they are
// linked once with it (each binary of their own took about 20 s to build):
// the alerting rules against a real Prometheus, README's curl cycle.
mod alert_rules;
mod readme_http;

mod t10_basic;
mod t20_failover;
mod t25_five_nodes;
mod t26_quorum_loss;
mod t27_partition;
mod t28_forward;
mod t30_restart;
mod t31_fail_stop;
mod t40_expiry;
mod t50_membership;
mod t60_snapshot;
mod t70_bad_input;
mod t80_client;
mod t81_client_semantics;
mod t82_keepalive;
mod t83_oneshot;
mod t84_http;
mod t85_upgrade;
mod t86_multi;
mod t87_revoke;
mod t88_console;
mod t89_lease_paths;
mod t90_observability;
mod t91_reflection;
mod t92_identity;
mod t93_probes;
mod t94_hostile_peer;
mod t95_tls;
mod t96_session_limit;
mod t97_backup;
mod t98_acl;
mod t99_peer_limits;
