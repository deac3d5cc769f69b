//! (to be written)

use std::sync::Arc;

use axum::Router;

use super::super::Gateway;

pub(super) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
}
