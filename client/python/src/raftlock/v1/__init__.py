"""Code generated from proto/raftlock/v1/locks.proto when the package is built."""
