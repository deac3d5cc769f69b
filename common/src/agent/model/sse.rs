//! A model's streamed answer read as server-sent events within the call's time limits, for every
//! provider that streams so (`openai`, `anthropic`): the body's bytes become events; a wait for the
//! next one ends after the idle timeout without any bytes (a keep-alive comment counts as
//! activity, though it makes no event) or at the whole call's deadline, whichever is first; a
//! body past [`MAX_RESPONSE_BYTES`], a broken connection and a malformed stream are failures the
//! providers report alike.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::stream::BoxStream;
use futures::StreamExt;

use super::openai::{transport_error, MAX_RESPONSE_BYTES};
use super::ModelError;

/// Why reading a streamed body stopped.
#[derive(Debug)]
pub(super) enum BodyError {
    Transport(reqwest::Error),
    TooLarge,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Transport(error) => error.fmt(f),
            BodyError::TooLarge => write!(f, "response body over {MAX_RESPONSE_BYTES} bytes"),
        }
    }
}

type SseEvents = BoxStream<'static, Result<Event, EventStreamError<BodyError>>>;

/// When the server last sent any bytes; shared between the body stream and its reader.
type LastActivity = Arc<Mutex<tokio::time::Instant>>;

/// The events of a streamed body, each waited for within the call's limits.
pub(super) struct TimedEvents {
    events: SseEvents,
    idle_timeout: Duration,
    last_activity: LastActivity,
    /// When the whole call must have ended.
    deadline: tokio::time::Instant,
}

impl TimedEvents {
    /// The events of `body`, each to arrive within `idle_timeout` of the last bytes, and none
    /// after `deadline`.
    pub fn new<B>(
        body: BoxStream<'static, Result<B, BodyError>>,
        idle_timeout: Duration,
        deadline: tokio::time::Instant,
    ) -> Self
    where
        B: AsRef<[u8]> + Send + 'static,
    {
        let last_activity: LastActivity = Arc::new(Mutex::new(tokio::time::Instant::now()));
        let seen = last_activity.clone();
        let events = body
            .map(move |chunk| {
                if chunk.is_ok() {
                    *seen.lock().unwrap_or_else(PoisonError::into_inner) =
                        tokio::time::Instant::now();
                }
                chunk
            })
            .eventsource()
            .boxed();
        Self {
            events,
            idle_timeout,
            last_activity,
            deadline,
        }
    }

    fn last_activity(&self) -> tokio::time::Instant {
        *self
            .last_activity
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The next event with data (events with none are skipped), or `None` where the body ends.
    pub async fn next(&mut self) -> Result<Option<Event>, ModelError> {
        loop {
            match self.next_event().await? {
                Some(Ok(event)) if event.data.trim().is_empty() => continue,
                Some(Ok(event)) => return Ok(Some(event)),
                Some(Err(EventStreamError::Transport(BodyError::Transport(error)))) => {
                    return Err(transport_error(error, self.idle_timeout))
                }
                Some(Err(EventStreamError::Transport(BodyError::TooLarge))) => {
                    return Err(ModelError::BadResponse(BodyError::TooLarge.to_string()))
                }
                Some(Err(error)) => {
                    return Err(ModelError::BadResponse(format!(
                        "malformed event stream: {error}"
                    )))
                }
                None => return Ok(None),
            }
        }
    }

    /// The next item of the event stream, waiting while the server sends anything (keep-alives
    /// included) within the idle timeout, and never past the whole call's deadline.
    async fn next_event(
        &mut self,
    ) -> Result<Option<Result<Event, EventStreamError<BodyError>>>, ModelError> {
        loop {
            let until = self.deadline.min(self.last_activity() + self.idle_timeout);
            if let Ok(next) = tokio::time::timeout_at(until, self.events.next()).await {
                return Ok(next);
            }
            let now = tokio::time::Instant::now();
            if now >= self.deadline || self.last_activity() + self.idle_timeout <= now {
                return Err(ModelError::TimedOut(self.idle_timeout));
            }
            // Bytes arrived that made no event yet (a keep-alive comment): wait on.
        }
    }
}
