//! A Lua script compiled into the binary, and one call of it written straight into its
//! `EVALSHA` command.
//!
//! `redis::ScriptInvocation` keeps its keys and arguments as byte vectors and copies them into a
//! command when it is sent, and its future holds both while the reply is awaited: a turn's end
//! (its history and final result among the arguments) was held three times over while Redis
//! answered. A [`LuaCall`] writes each argument once, into the command that is sent.

use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// Room in a call's command for its name, hash, key count and arguments (its keys come on
/// top): more than any script of the store takes, but for the messages of a save or an end.
const COMMON_ARGS: usize = 24;

/// A Lua script compiled into the binary. Its SHA1 (what `EVALSHA` names it by) is computed once,
/// on first use, rather than on every call.
pub(super) struct Lua {
    code: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    pub(super) const fn new(code: &'static str) -> Self {
        Self {
            code,
            script: OnceLock::new(),
        }
    }

    fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.code))
    }

    /// A call of the script, to be given its keys, then its arguments.
    pub(super) fn call(&self) -> LuaCall<'_> {
        LuaCall {
            script: self.script(),
            keys: Vec::new(),
            command: None,
        }
    }

    /// A call of the script with `key` as its first key.
    pub(super) fn key<K: ToRedisArgs>(&self, key: K) -> LuaCall<'_> {
        let mut call = self.call();
        call.key(key);
        call
    }
}

/// One call of a [`Lua`] script: its keys (all given before the first argument), then its
/// arguments, written into the `EVALSHA` command as they are given.
pub(super) struct LuaCall<'a> {
    script: &'a Script,
    /// The keys given so far, until the first argument writes them into the command (their
    /// count comes before them there).
    keys: Vec<Vec<u8>>,
    command: Option<Cmd>,
}

impl LuaCall<'_> {
    /// Adds a key. Keys come before every argument.
    pub(super) fn key<K: ToRedisArgs>(&mut self, key: K) -> &mut Self {
        debug_assert!(
            self.command.is_none(),
            "a script's keys come before its arguments"
        );
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument (a sequence adds each of its items).
    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.command().arg(arg);
        self
    }

    fn command(&mut self) -> &mut Cmd {
        let Self {
            script,
            keys,
            command,
        } = self;
        command.get_or_insert_with(|| {
            // Sized for a usual call up front, so that a small one is two allocations rather
            // than a buffer grown from empty; a call with large arguments grows it once or twice.
            let key_bytes: usize = keys.iter().map(Vec::len).sum();
            let mut command = Cmd::with_capacity(COMMON_ARGS + keys.len(), 256 + key_bytes);
            command
                .arg("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(&keys[..]);
            *keys = Vec::new();
            command
        })
    }

    /// Runs the script; a server that does not know it yet (restarted, failed over, flushed) is
    /// given it and asked again.
    pub(super) async fn invoke_async<T: FromRedisValue>(
        &mut self,
        connection: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        let script = self.script;
        let command = self.command();
        match command.query_async(connection).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // Boxed: rare (a server restarted, failed over or flushed), and inline it would
                // size every script call's future.
                Box::pin(script.load_async(connection)).await?;
                command.query_async(connection).await
            }
            answered => answered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(command: &Cmd) -> Vec<u8> {
        command.get_packed_command()
    }

    #[test]
    fn a_call_is_the_evalsha_of_its_keys_then_its_arguments() {
        static ECHO: Lua = Lua::new("return ARGV");
        let mut call = ECHO.key("k1");
        call.key("k2").arg("a").arg(vec!["b", "c"]).arg(7);
        let mut expected = redis::cmd("EVALSHA");
        expected
            .arg(ECHO.script().get_hash())
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg("a")
            .arg("b")
            .arg("c")
            .arg(7);
        assert_eq!(packed(call.command()), packed(&expected));
    }

    #[test]
    fn a_call_without_arguments_still_names_its_keys() {
        static KEYS: Lua = Lua::new("return KEYS");
        let mut call = KEYS.call();
        call.key("only");
        let mut expected = redis::cmd("EVALSHA");
        expected.arg(KEYS.script().get_hash()).arg(1).arg("only");
        assert_eq!(packed(call.command()), packed(&expected));
        let mut none = KEYS.call();
        let mut expected = redis::cmd("EVALSHA");
        expected.arg(KEYS.script().get_hash()).arg(0);
        assert_eq!(packed(none.command()), packed(&expected));
    }
}
