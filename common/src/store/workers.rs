//! The worker registry: announcements refreshed by heartbeats, and the two views leads read
//! (routable and live), pruned of silent, unreadable or invalid entries.

use redis::AsyncCommands;

use super::{keys, SessionStore, StoreError};
use crate::protocol::WorkerAnnouncement;

impl SessionStore {
    /// Publishes (or refreshes) a worker's announcement in the registry.
    pub async fn announce_worker(
        &self,
        announcement: &WorkerAnnouncement,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let json = serde_json::to_string(announcement).map_err(StoreError::Corrupt)?;
        let _: i64 = conn
            .hset(keys::WORKERS, &announcement.worker_id, json)
            .await?;
        Ok(())
    }

    /// Removes a worker from the registry (on drain).
    pub async fn remove_worker(&self, worker_id: &str) -> Result<(), StoreError> {
        let mut conn = self.connection.clone();
        let _: i64 = conn.hdel(keys::WORKERS, worker_id).await?;
        Ok(())
    }

    /// Live workers (heard from within three heartbeats).
    pub async fn live_workers(&self) -> Result<Vec<WorkerAnnouncement>, StoreError> {
        let now = crate::protocol::now_ms();
        let mut workers = self.routable_workers().await?;
        workers.retain(|w| w.is_alive(now));
        Ok(workers)
    }

    /// Workers whose pools calls may be routed to (see `WorkerAnnouncement::is_routable`); entries
    /// silent for longer, unreadable, or failing their checks (`WorkerAnnouncement::check`, an
    /// entry filed under another id, a heartbeat from the future) are pruned from the registry.
    pub async fn routable_workers(&self) -> Result<Vec<WorkerAnnouncement>, StoreError> {
        let mut conn = self.connection.clone();
        let all: Vec<(String, String)> = conn.hgetall(keys::WORKERS).await?;
        let now = crate::protocol::now_ms();
        let mut routable = Vec::new();
        for (id, json) in all {
            match serde_json::from_str::<WorkerAnnouncement>(&json) {
                Ok(a) if a.is_routable(now) && a.worker_id == id && a.check().is_ok() => {
                    routable.push(a)
                }
                Ok(a) if a.is_routable(now) => {
                    let worker_id = crate::text::cut(&id, 64);
                    tracing::warn!(%worker_id, "invalid worker registry entry removed");
                    let _: i64 = conn.hdel(keys::WORKERS, &id).await?;
                }
                _ => {
                    let _: i64 = conn.hdel(keys::WORKERS, &id).await?;
                }
            }
        }
        routable.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        Ok(routable)
    }
}
