//! Integration tests of the gRPC surface: each test starts the real server
//! on `127.0.0.1:0` (the same `run` the binary calls), drives it through the
//! generated clients, and shuts it down.

mod common;
mod health;
