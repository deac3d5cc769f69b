//! HTTP steps of the Anthropic client, each bounded in time (and a body in size), their failures
//! mapped onto [`ModelError`] the way the OpenAI-compatible client maps its own.
//!
//! A refusal is [`ModelError::Status`] with the body (cut to [`MAX_ERROR_BODY_BYTES`]); with a
//! 429 (rate limited), a 529 (overloaded) or any other 5xx it carries the server's
//! `retry-after` (seconds) when sent. A 400 whose body says "prompt is too long" is then a
//! context overflow ([`ModelError::to_failure`]).

use std::time::Duration;

use super::super::ModelError;

/// Longest error body kept in [`ModelError::Status`] and [`ModelError::ServerError`].
pub(super) const MAX_ERROR_BODY_BYTES: usize = 2048;

/// Runs one HTTP step within `timeout`, mapping its failures onto [`ModelError`].
pub(super) async fn bounded<T>(
    timeout: Duration,
    step: impl std::future::Future<Output = reqwest::Result<T>>,
) -> Result<T, ModelError> {
    tokio::time::timeout(timeout, step)
        .await
        .map_err(|_| ModelError::TimedOut(timeout))?
        .map_err(|error| transport_error(error, timeout))
}

pub(super) use super::super::openai::{read_capped, transport_error};

/// Passes a 2xx response through; turns any other into [`ModelError::Status`].
pub(super) async fn error_for_status(
    response: reqwest::Response,
    timeout: Duration,
) -> Result<reqwest::Response, ModelError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = (status.as_u16() == 429 || status.is_server_error())
        .then(|| retry_after_seconds(response.headers()))
        .flatten();
    let body = match tokio::time::timeout(timeout, response.text()).await {
        Ok(Ok(body)) => crate::text::cut(&body, MAX_ERROR_BODY_BYTES),
        Ok(Err(error)) => format!("<body unreadable: {error}>"),
        Err(_) => "<body not received in time>".to_owned(),
    };
    tracing::debug!(status = status.as_u16(), "messages request refused");
    Err(ModelError::Status {
        status: status.as_u16(),
        body,
        retry_after,
    })
}

/// A `retry-after` given in seconds (what the API sends); an HTTP date is not read.
pub(super) fn retry_after_seconds(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Whether the server answered with whole JSON, not a stream of events.
pub(super) fn answers_with_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("application/json"))
}
