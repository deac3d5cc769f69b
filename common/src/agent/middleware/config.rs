//! Configuration of the built-in layers, and why a configuration is refused.
//!
//! Invariants: a [`BuiltinConfig`] that passed [`BuiltinConfig::validate`] builds every built-in
//! without failing; the default configuration is valid. Retrying tool calls is off by default
//! (a tool call has effects); retrying model calls is on.

use std::time::Duration;

use super::redact::{Redactor, SecretTooShort};

/// How the built-in layers behave; each built-in is off when its field says so.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltinConfig {
    /// Longest one model attempt may take; `None` leaves it to the provider's own timeout.
    pub model_timeout: Option<Duration>,
    /// Retries of transient model failures.
    pub model_retry: RetryConfig,
    /// Retries of tool calls that failed `unavailable` (never `timed_out`: such a call may still
    /// run); off by default.
    pub tool_retry: RetryConfig,
    /// Most model calls in flight at once through one built service and its clones.
    pub model_concurrency: Option<usize>,
    /// Most tool calls in flight at once through one built service and its clones.
    pub tool_concurrency: Option<usize>,
    /// Secret values masked as [`REDACTED`](super::REDACTED) in tool results and model answers;
    /// empty strings are ignored, one shorter than [`MIN_SECRET_BYTES`](super::MIN_SECRET_BYTES) is
    /// refused.
    pub secrets: Vec<String>,
    /// One debug line per model or tool call.
    pub log: bool,
}

impl Default for BuiltinConfig {
    fn default() -> Self {
        Self {
            model_timeout: None,
            model_retry: RetryConfig::default(),
            tool_retry: RetryConfig::off(),
            model_concurrency: None,
            tool_concurrency: None,
            secrets: Vec::new(),
            log: true,
        }
    }
}

impl BuiltinConfig {
    /// Refuses a configuration a built-in cannot work with.
    pub fn validate(&self) -> Result<(), MiddlewareError> {
        if self.model_timeout == Some(Duration::ZERO) {
            return Err(MiddlewareError::ZeroTimeout);
        }
        for (service, limit) in [
            ("model", self.model_concurrency),
            ("tool", self.tool_concurrency),
        ] {
            if limit == Some(0) {
                return Err(MiddlewareError::ZeroConcurrency { service });
            }
        }
        for (service, retry) in [("model", &self.model_retry), ("tool", &self.tool_retry)] {
            if retry.attempts == 0 {
                return Err(MiddlewareError::NoAttempts { service });
            }
        }
        for secret in &self.secrets {
            Redactor::check(secret)?;
        }
        Ok(())
    }
}

/// Exponential backoff between attempts: `base_delay`, doubling up to `max_delay`, each delay
/// with a random part of up to half of it added (never past `max_delay`).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// Attempts in all, the first included: 1 turns retrying off.
    pub attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl RetryConfig {
    /// One attempt, no retry.
    pub fn off() -> Self {
        Self {
            attempts: 1,
            ..Self::default()
        }
    }

    /// Whether a failed attempt may be followed by another.
    pub fn is_on(&self) -> bool {
        self.attempts > 1
    }
}

impl Default for RetryConfig {
    /// Three attempts, 200 ms then 400 ms apart (plus the random part), at most 5 s.
    fn default() -> Self {
        Self {
            attempts: 3,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
        }
    }
}

/// Why a built-in configuration is refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MiddlewareError {
    #[error("{service} retry needs at least one attempt")]
    NoAttempts { service: &'static str },
    #[error("{service} retry backoff is invalid")]
    InvalidBackoff {
        service: &'static str,
        #[source]
        source: tower::retry::backoff::InvalidBackoff,
    },
    #[error("{service} concurrency limit must be at least 1")]
    ZeroConcurrency { service: &'static str },
    #[error("model timeout must be longer than zero")]
    ZeroTimeout,
    #[error(transparent)]
    SecretTooShort(#[from] SecretTooShort),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_is_valid_and_retries_only_the_model() {
        let config = BuiltinConfig::default();
        assert!(config.validate().is_ok());
        assert!(config.model_retry.is_on());
        assert!(!config.tool_retry.is_on());
    }

    #[test]
    fn unusable_values_are_refused() {
        let cases = [
            BuiltinConfig {
                model_timeout: Some(Duration::ZERO),
                ..BuiltinConfig::default()
            },
            BuiltinConfig {
                model_concurrency: Some(0),
                ..BuiltinConfig::default()
            },
            BuiltinConfig {
                tool_retry: RetryConfig {
                    attempts: 0,
                    ..RetryConfig::default()
                },
                ..BuiltinConfig::default()
            },
            BuiltinConfig {
                secrets: vec!["k".into()],
                ..BuiltinConfig::default()
            },
        ];
        for config in cases {
            assert!(config.validate().is_err(), "{config:?} was accepted");
        }
    }
}
