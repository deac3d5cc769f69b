//! Skein's integration-test support library: real `nats-server` and `redis-server` processes on
//! free ports, a fake OpenAI-compatible chat-completions server, child-process handles and polling
//! helpers. The tests themselves live in `tests/tests/*.rs`.

pub mod support;
