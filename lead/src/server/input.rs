//! A submission's input as its turn runs it: the text, and the images as the session keeps them.
//!
//! Invariants:
//! - an image sent inline (a `data:` URL) larger than [`INLINE_IMAGE_MAX`] is stored in the
//!   tenant's payload bucket (under the task, so a turn run again stores nothing new) and kept by
//!   reference: the session's history and checkpoints never hold a large image's bytes;
//! - smaller inline images, images by URL and images by reference are kept as they came;
//! - an input that breaks a rule fails the task (`invalid_input`, `too_large`, `denied`); a
//!   store that cannot be reached hands it back (`unavailable`).

use base64::Engine;
use skein_common::payloads::PayloadStore;
use skein_common::protocol::{Failure, FailureKind, ImageLimits, ImagePart, TaskSubmission};

/// Largest inline image (bytes of base64) a session keeps in its history.
pub(crate) const INLINE_IMAGE_MAX: usize = 16 * 1024;

/// The images of `submission`'s input as its session keeps them (see the module docs).
pub(crate) async fn session_images(
    payloads: &PayloadStore,
    submission: &TaskSubmission,
    limits: &ImageLimits,
) -> Result<Vec<ImagePart>, Failure> {
    let mut images = submission.images(limits)?;
    for image in &mut images {
        let ImagePart::Base64 { media_type, data } = image else {
            continue;
        };
        if data.len() <= INLINE_IMAGE_MAX {
            continue;
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .map_err(|e| {
                Failure::new(
                    FailureKind::InvalidInput,
                    format!("an input image is not valid base64: {e}"),
                )
            })?;
        // Boxed: the store's write is deep, and the turn's future deep already.
        let stored = Box::pin(payloads.store(
            &submission.tenant,
            &submission.session,
            &submission.task_id,
            bytes.into(),
        ))
        .await
        .map_err(|e| skein_common::payloads::failure("an input image could not be stored", &e))?;
        *image = ImagePart::Payload {
            media_type: std::mem::take(media_type),
            payload: stored,
        };
    }
    Ok(images)
}
