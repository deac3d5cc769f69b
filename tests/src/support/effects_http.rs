//! An HTTP service that applies effects the way payment APIs do: a `POST /effects` with an
//! `Idempotency-Key` is applied once per key — a repeat of a key gets the first response back
//! (waiting for it while the first is still being applied) and applies nothing. Applying takes a
//! while and, once started, finishes even if the client goes away (a caller killed mid-call
//! cannot take its effect back). It counts requests and applications per key and per effect, so
//! a test can tell how often a call ran and how often its effect was applied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use tokio::sync::watch;

/// What the service saw.
#[derive(Debug, Default, Clone)]
pub struct EffectCounts {
    /// Requests by idempotency key (a key seen twice is a call that ran twice).
    pub requests_by_key: HashMap<String, u32>,
    /// Effects applied, by the `effect` named in the body.
    pub applied_by_effect: HashMap<String, u32>,
    /// Requests that came without an idempotency key.
    pub without_key: u32,
    /// Requests being applied right now.
    pub in_flight: u32,
}

impl EffectCounts {
    /// Keys that were sent more than once.
    pub fn repeated_keys(&self) -> usize {
        self.requests_by_key.values().filter(|n| **n > 1).count()
    }
}

type Outcome = watch::Receiver<Option<String>>;

#[derive(Default)]
struct Ledger {
    counts: EffectCounts,
    by_key: HashMap<String, Outcome>,
}

/// A running service; stops when dropped.
pub struct EffectsHttp {
    pub base_url: String,
    ledger: Arc<Mutex<Ledger>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Shared {
    ledger: Arc<Mutex<Ledger>>,
    apply_for: Duration,
}

impl EffectsHttp {
    /// Starts on a free port of 127.0.0.1; applying an effect takes `apply_for`.
    pub async fn start(apply_for: Duration) -> Self {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let shared = Shared {
            ledger: ledger.clone(),
            apply_for,
        };
        let app = Router::new()
            .route("/effects", post(apply))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1 can be bound");
        let port = listener.local_addr().expect("bound address").port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base_url: format!("http://127.0.0.1:{port}"),
            ledger,
            task,
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> EffectCounts {
        self.ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counts
            .clone()
    }
}

impl Drop for EffectsHttp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn apply(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let Some(effect) = body
        .get("effect")
        .and_then(|e| e.as_str())
        .map(str::to_owned)
    else {
        return (
            StatusCode::BAD_REQUEST,
            "body needs an `effect` string".into(),
        );
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .map(str::to_owned);
    let mut outcome = {
        let mut ledger = shared.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        match &key {
            Some(key) => {
                *ledger
                    .counts
                    .requests_by_key
                    .entry(key.clone())
                    .or_default() += 1;
                match ledger.by_key.get(key) {
                    Some(earlier) => earlier.clone(),
                    None => {
                        let outcome = start_applying(&shared, &mut ledger, effect);
                        ledger.by_key.insert(key.clone(), outcome.clone());
                        outcome
                    }
                }
            }
            None => {
                ledger.counts.without_key += 1;
                start_applying(&shared, &mut ledger, effect)
            }
        }
    };
    let answer = match outcome.wait_for(Option::is_some).await {
        Ok(done) => (StatusCode::OK, done.clone().unwrap_or_default()),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "effect lost".into()),
    };
    answer
}

/// Applies `effect` in a task of its own (it finishes whatever happens to the request).
fn start_applying(shared: &Shared, ledger: &mut Ledger, effect: String) -> Outcome {
    let (done, outcome) = watch::channel(None);
    ledger.counts.in_flight += 1;
    let (ledger, apply_for) = (shared.ledger.clone(), shared.apply_for);
    tokio::spawn(async move {
        tokio::time::sleep(apply_for).await;
        let mut ledger = ledger.lock().unwrap_or_else(PoisonError::into_inner);
        ledger.counts.in_flight -= 1;
        let applied = ledger
            .counts
            .applied_by_effect
            .entry(effect.clone())
            .or_default();
        *applied += 1;
        let _ = done.send(Some(format!("applied {effect}")));
    });
    outcome
}
