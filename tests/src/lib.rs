//! Cluster integration tests for raftlock: real nodes, real gRPC, real sled
//! on loopback, each node in its own temp directory. The tests are in
//! `tests/cluster/` (one binary, a module per area, run in the order of
//! their numbers); what they run on (`TestCluster`, polling helpers,
//! partitions) is the `raftlock-testkit` crate.
