//! The client's integration tests, one test binary with a module per area:
//! linked once instead of five times (each binary monomorphised and linked
//! the client, the test kit and the node on its own, about 20 s of build
//! each on two cores).

mod cli;
mod k8s_guard;
mod keepalive_answers;
mod python_examples;
mod scenarios;
