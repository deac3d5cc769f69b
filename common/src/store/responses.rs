//! Runs started through the gateway's Responses API, by their response id: which session and
//! task a response is, so `GET /v1/responses/{id}` finds its run and `previous_response_id`
//! continues its session, on any gateway.
//!
//! Invariants: a record is written once (`SET NX`): a retried request with the same
//! `Idempotency-Key` finds the first one; it belongs to one tenant (the key names it) and expires
//! with the sessions (`SKEIN_SESSION_TTL`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{keys, SessionStore, StoreError};

/// What a response id stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseRecord {
    /// The response id, which is also its task's id.
    pub id: String,
    pub session: String,
    /// The agent (the request's `model`).
    pub agent: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub background: bool,
    /// The task the response follows when it is not its own: a response that answers calls
    /// waiting for approval goes on with the task of the response that asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The task's events before this response begins (those it held when the response answered
    /// its calls).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub after_events: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ResponseRecord {
    /// The task whose events the response is.
    pub fn task(&self) -> &str {
        self.task_id.as_deref().unwrap_or(&self.id)
    }
}

impl SessionStore {
    /// Stores `record` unless one with its id exists; returns the record that stands.
    pub async fn put_response(
        &self,
        tenant: &str,
        record: &ResponseRecord,
    ) -> Result<ResponseRecord, StoreError> {
        if self
            .set_new_json(&keys::response(tenant, &record.id), record)
            .await?
        {
            return Ok(record.clone());
        }
        self.response(tenant, &record.id)
            .await?
            .ok_or(StoreError::UnexpectedReply("SET NX of a response record"))
    }

    /// The record of response `id` of `tenant`, if there is one.
    pub async fn response(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<ResponseRecord>, StoreError> {
        let mut conn = self.connection.clone();
        let json: Option<String> = redis::cmd("GET")
            .arg(keys::response(tenant, id))
            .query_async(&mut conn)
            .await?;
        json.map(|json| serde_json::from_str(&json).map_err(StoreError::Corrupt))
            .transpose()
    }
}
