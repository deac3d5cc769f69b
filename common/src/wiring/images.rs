//! [`ImageLayer`]: the model-service layer, just outside the provider, that makes a request's
//! images sendable: images stored by reference are read from the tenant's payload bucket into
//! inline bytes, and a request showing more images than the cap shows only the newest.
//!
//! Invariants:
//! - only the request sent changes: the session and its checkpoints keep references, so a stored
//!   image is read for each model call that shows it and never kept in Redis;
//! - a reference is read for the calling task's tenant only (its bucket); the references a
//!   submission may carry were checked against its session at admission, and the ones a worker
//!   wrote name the session of the call that returned them;
//! - nothing is left out silently: an image over the count cap, or one whose stored bytes expired
//!   ([`RETENTION`](crate::payloads::RETENTION)), becomes a note in its message's text that says
//!   so; a store that cannot be reached fails the call (`unavailable`, tried again).

use std::task::{Context, Poll};

use base64::Engine;
use futures::future::BoxFuture;
use tower::{Layer, Service};

use crate::agent::model::ModelResponse;
use crate::agent::seams::{BoxError, ModelCall};
use crate::payloads::PayloadStore;
use crate::protocol::message::Message;
use crate::protocol::{ImageLimits, ImagePart};
use crate::workspace::WorkspaceError;

/// Reads stored images into the request and holds it to the image count cap.
#[derive(Clone)]
pub struct ImageLayer {
    payloads: PayloadStore,
    limits: ImageLimits,
}

impl ImageLayer {
    pub fn new(payloads: PayloadStore, limits: ImageLimits) -> Self {
        Self { payloads, limits }
    }
}

impl<S> Layer<S> for ImageLayer {
    type Service = Images<S>;

    fn layer(&self, inner: S) -> Images<S> {
        Images {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`ImageLayer`].
#[derive(Clone)]
pub struct Images<S> {
    inner: S,
    layer: ImageLayer,
}

impl<S> Service<ModelCall> for Images<S>
where
    S: Service<ModelCall, Response = ModelResponse> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = ModelResponse;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<ModelResponse, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut call: ModelCall) -> Self::Future {
        let mut ready = crate::agent::middleware::take_ready(&mut self.inner);
        let layer = self.layer.clone();
        Box::pin(async move {
            if call.request.messages.iter().any(|m| !m.images.is_empty()) {
                // A copy of its own only where images are (the retry layer may share it).
                let messages = std::sync::Arc::make_mut(&mut call.request.messages);
                keep_newest_images(messages, layer.limits.max_images);
                if let Some(tenant) = call.origin.as_ref().map(|o| o.tenant.clone()) {
                    // Boxed: inline, it would size the future every model call keeps while it
                    // waits for its answer, images or not.
                    Box::pin(read_stored(&layer.payloads, &tenant, messages)).await?;
                }
            }
            ready.call(call).await.map_err(Into::into)
        })
    }
}

/// Leaves the newest `max` images of `messages` in place; each older one becomes a note at the
/// end of its message's text.
pub fn keep_newest_images(messages: &mut [Message], max: usize) {
    let total: usize = messages.iter().map(|m| m.images.len()).sum();
    let mut over = total.saturating_sub(max);
    for message in messages.iter_mut() {
        if over == 0 {
            break;
        }
        let dropped = over.min(message.images.len());
        let left_out: Vec<ImagePart> = message.images.drain(..dropped).collect();
        for image in left_out {
            note(
                message,
                &format!(
                    "[{} left out: a request shows at most {max} images, the newest]",
                    image.describe()
                ),
            );
        }
        over -= dropped;
    }
}

/// Reads every image of `messages` stored by reference into inline bytes, for `tenant`.
async fn read_stored(
    payloads: &PayloadStore,
    tenant: &str,
    messages: &mut [Message],
) -> Result<(), BoxError> {
    for message in messages.iter_mut() {
        if !message
            .images
            .iter()
            .any(|i| matches!(i, ImagePart::Payload { .. }))
        {
            continue;
        }
        let mut notes = Vec::new();
        let mut kept = Vec::with_capacity(message.images.len());
        for image in std::mem::take(&mut message.images) {
            let ImagePart::Payload {
                media_type,
                payload,
            } = &image
            else {
                kept.push(image);
                continue;
            };
            // Boxed, as the payload store's own reads are (the read is deep).
            match Box::pin(payloads.load(tenant, None, payload)).await {
                Ok(bytes) => kept.push(ImagePart::Base64 {
                    media_type: media_type.clone(),
                    data: base64::engine::general_purpose::STANDARD.encode(&bytes),
                }),
                Err(WorkspaceError::NotFound(_)) => notes.push(format!(
                    "[{} is no longer stored: stored images are kept {} days]",
                    image.describe(),
                    crate::payloads::RETENTION.as_secs() / 86_400
                )),
                Err(e) => {
                    let failure = crate::payloads::failure("an image could not be read", &e);
                    return Err(Box::new(failure));
                }
            }
        }
        message.images = kept;
        for text in notes {
            note(message, &text);
        }
    }
    Ok(())
}

fn note(message: &mut Message, text: &str) {
    if !message.content.is_empty() {
        message.content.push('\n');
    }
    message.content.push_str(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(n: usize) -> ImagePart {
        ImagePart::Url {
            url: format!("https://example.com/{n}.png"),
        }
    }

    #[test]
    fn past_the_cap_the_oldest_images_become_notes_and_the_newest_stay() {
        let mut messages = vec![
            Message::user("first").with_images(vec![image(1), image(2)]),
            Message::assistant("ok"),
            Message::tool_result("c1", "shot").with_images(vec![image(3)]),
            Message::user("").with_images(vec![image(4)]),
        ];
        keep_newest_images(&mut messages, 2);
        assert!(messages[0].images.is_empty());
        assert!(messages[0]
            .content
            .starts_with("first\n[image at https://example.com/1.png left out"));
        assert!(messages[0]
            .content
            .contains("2.png left out: a request shows at most 2 images"));
        assert_eq!(messages[2].images, vec![image(3)]);
        assert_eq!(messages[2].content, "shot");
        assert_eq!(messages[3].images, vec![image(4)]);
        assert_eq!(messages[3].content, "");

        let mut within = vec![Message::user("a").with_images(vec![image(1)])];
        keep_newest_images(&mut within, 20);
        assert_eq!(within[0].images.len(), 1);
        assert_eq!(within[0].content, "a");
    }
}
