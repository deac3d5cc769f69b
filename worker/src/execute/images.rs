//! Images a tool returned, as its result carries them: each stored whole in the tenant's payload
//! bucket and sent by reference, so a result never outgrows a broker message and the session's
//! history keeps references only.
//!
//! Invariants:
//! - an image is stored under the call's session and task (`<session>/<task>/<digest>`), so a
//!   run of the call again stores nothing new;
//! - an image that cannot be stored fails the call (`unavailable` when the store is away, so the
//!   call is tried again; `too_large` past the store's cap): none is dropped.

use skein_common::payloads::PayloadStore;
use skein_common::protocol::{Failure, ImagePart, TaskOrigin};

use crate::tools::ToolImage;

/// `images` stored for `origin`'s call, as the references its result carries.
pub(super) async fn store_images(
    payloads: &PayloadStore,
    origin: &TaskOrigin,
    images: Vec<ToolImage>,
) -> Result<Vec<ImagePart>, Failure> {
    let mut stored = Vec::with_capacity(images.len());
    for image in images {
        // Boxed: the store's write is deep, and the task's future deep already.
        let payload =
            Box::pin(payloads.store(&origin.tenant, &origin.session, &origin.task_id, image.data))
                .await
                .map_err(|e| {
                    skein_common::payloads::failure(
                        "an image the tool returned could not be stored",
                        &e,
                    )
                })?;
        stored.push(ImagePart::Payload {
            media_type: image.media_type,
            payload,
        });
    }
    Ok(stored)
}
