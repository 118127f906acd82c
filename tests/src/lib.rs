//! Cluster integration tests for raftlock. The `TestCluster` harness arrives
//! with the replicated-node issue.
