//! The gateway example (`examples/gateway/`) over real loopback connections: mock workers
//! with their own prefix caches, the gateway in front, clients. Everything is started and
//! stopped here, bounded in count and time. One test crate, so that the example's modules
//! are built once.

#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

mod admission;
mod engines;
#[cfg(feature = "zmq")]
mod events;
mod fleet;
mod http;
mod load;
#[cfg(feature = "zmq")]
mod openai;
mod overload;
mod pd;
mod pd_telemetry;
mod pd_vllm;
mod prompts;
mod python_package;
#[cfg(feature = "zmq")]
mod replicas;
mod streams;
mod telemetry;
