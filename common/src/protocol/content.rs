//! Content besides text: the images a message shows the model ([`ImagePart`]), a submission's
//! input as text or as content parts ([`SubmissionInput`], in the shape OpenAI's chat API gives
//! clients), and the caps images are held to ([`ImageLimits`]).
//!
//! Invariants:
//! - a submission whose input is a plain string reads and writes exactly as before parts existed;
//! - an image part names where its bytes are: a URL the provider fetches, inline base64 (small
//!   images), or a [`PayloadRef`] into the tenant's payload bucket (large ones: sessions and
//!   checkpoints keep the reference, and the bytes are read only when a model request is built);
//! - an inline or stored image is one of [`IMAGE_MEDIA_TYPES`] (what every provider takes);
//! - a part that breaks a rule is refused with a message naming the part, never dropped.

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::{Failure, FailureKind, PayloadRef};

/// The image types accepted inline or by reference.
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Largest image (decoded bytes) taken by default; see [`ImageLimits`].
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// Most images one model request carries by default; see [`ImageLimits`].
pub const DEFAULT_MAX_IMAGES: usize = 20;

/// An image a message shows the model, after the message's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum ImagePart {
    /// At an `http(s)` URL the provider fetches itself.
    Url { url: String },
    /// The image's bytes, base64-encoded (standard alphabet, padded).
    Base64 { media_type: String, data: String },
    /// Stored whole in the tenant's payload bucket; read when a model request is built.
    Payload {
        media_type: String,
        payload: PayloadRef,
    },
}

impl ImagePart {
    /// The image's size in bytes when it is known here (inline or stored); `None` for a URL.
    pub fn size(&self) -> Option<u64> {
        match self {
            ImagePart::Url { .. } => None,
            ImagePart::Base64 { data, .. } => Some(base64_decoded_len(data)),
            ImagePart::Payload { payload, .. } => Some(payload.size),
        }
    }

    /// A short description for notes and errors: the URL's start, or the type and size.
    pub fn describe(&self) -> String {
        match self {
            ImagePart::Url { url } => format!("image at {}", crate::text::cut(url, 120)),
            ImagePart::Base64 { media_type, .. } | ImagePart::Payload { media_type, .. } => {
                format!("{media_type} image of {} bytes", self.size().unwrap_or(0))
            }
        }
    }

    /// The image as a `data:` URL, when its bytes are inline.
    pub fn data_url(&self) -> Option<String> {
        match self {
            ImagePart::Base64 { media_type, data } => {
                Some(format!("data:{media_type};base64,{data}"))
            }
            _ => None,
        }
    }
}

/// The caps images are held to: each image's size, and how many one model request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest image, in decoded bytes (`SKEIN_MODEL_MAX_IMAGE_BYTES`).
    pub max_image_bytes: u64,
    /// Most images in one submission, one tool result and one model request
    /// (`SKEIN_MODEL_MAX_IMAGES`).
    pub max_images: usize,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_images: DEFAULT_MAX_IMAGES,
        }
    }
}

impl ImageLimits {
    /// Checks `images`, which `what` produced ("the input", "the tool's result"), against the
    /// caps: too many, or one too large, is `too_large` naming the cap.
    pub fn check(&self, what: &str, images: &[ImagePart]) -> Result<(), Failure> {
        if images.len() > self.max_images {
            return Err(Failure::new(
                FailureKind::TooLarge,
                format!(
                    "{what} holds {} images; at most {} are taken (SKEIN_MODEL_MAX_IMAGES)",
                    images.len(),
                    self.max_images
                ),
            ));
        }
        for (i, image) in images.iter().enumerate() {
            if let Some(size) = image.size().filter(|size| *size > self.max_image_bytes) {
                return Err(Failure::new(
                    FailureKind::TooLarge,
                    format!(
                        "image {} of {what} is {size} bytes; images may be at most {} bytes \
                         (SKEIN_MODEL_MAX_IMAGE_BYTES)",
                        i + 1,
                        self.max_image_bytes
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A submission's input: the user's text, or content parts (text and images).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SubmissionInput {
    Text(String),
    /// Content parts in order, as OpenAI's chat API takes them, plus images by payload reference.
    Parts(Vec<InputPart>),
}

/// One content part of a submission's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputPart {
    Text {
        text: String,
    },
    /// An image by URL: `https://…` (fetched by the provider) or `data:image/png;base64,…`.
    ImageUrl {
        image_url: ImageUrl,
    },
    /// An image stored in the tenant's payload bucket (for images too large for one message):
    /// its object named `<session>/…` of this submission's session.
    Image {
        payload: PayloadRef,
        media_type: String,
    },
}

/// The `image_url` of an image part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImageUrl {
    pub url: String,
    /// OpenAI's resolution hint; accepted and not passed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Default for SubmissionInput {
    fn default() -> Self {
        SubmissionInput::Text(String::new())
    }
}

impl From<String> for SubmissionInput {
    fn from(text: String) -> Self {
        SubmissionInput::Text(text)
    }
}

impl From<&str> for SubmissionInput {
    fn from(text: &str) -> Self {
        SubmissionInput::Text(text.to_owned())
    }
}

impl<'de> Deserialize<'de> for SubmissionInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(SubmissionInput::Text(text)),
            Value::Array(parts) => parts
                .into_iter()
                .enumerate()
                .map(|(i, part)| {
                    let kind = part.get("type").and_then(Value::as_str).map(str::to_owned);
                    serde_json::from_value(part).map_err(|e| {
                        let kind = kind.map(|k| format!(" ({k:?})")).unwrap_or_default();
                        D::Error::custom(format!(
                            "input part {}{kind}: {e}; a part is {{\"type\":\"text\",\"text\":…}}, \
                             {{\"type\":\"image_url\",\"image_url\":{{\"url\":…}}}} or \
                             {{\"type\":\"image\",\"payload\":…,\"media_type\":…}}",
                            i + 1
                        ))
                    })
                })
                .collect::<Result<_, _>>()
                .map(SubmissionInput::Parts),
            other => Err(D::Error::custom(format!(
                "input must be a string or an array of content parts, not {}",
                json_kind(&other)
            ))),
        }
    }
}

impl SubmissionInput {
    /// The input's text: the string, or the text parts joined by blank lines.
    pub fn text(&self) -> String {
        match self {
            SubmissionInput::Text(text) => text.clone(),
            SubmissionInput::Parts(parts) => parts
                .iter()
                .filter_map(|part| match part {
                    InputPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n\n"),
        }
    }

    /// Bytes the input takes in a message: its text and image URLs (stored images count their
    /// reference only).
    pub fn len(&self) -> usize {
        match self {
            SubmissionInput::Text(text) => text.len(),
            SubmissionInput::Parts(parts) => parts
                .iter()
                .map(|part| match part {
                    InputPart::Text { text } => text.len(),
                    InputPart::ImageUrl { image_url } => image_url.url.len(),
                    InputPart::Image { payload, .. } => payload.name.len() + payload.bucket.len(),
                })
                .sum(),
        }
    }

    /// True when it holds neither text (other than white space) nor an image.
    pub fn is_empty(&self) -> bool {
        match self {
            SubmissionInput::Text(text) => text.trim().is_empty(),
            SubmissionInput::Parts(parts) => parts.iter().all(|part| match part {
                InputPart::Text { text } => text.trim().is_empty(),
                _ => false,
            }),
        }
    }

    /// The input's images as message parts, in order: `data:` URLs decoded into inline images,
    /// other URLs kept, stored images by reference. A part that breaks a rule (a URL that is not
    /// `http(s)` or a base64 `data:` URL of an accepted type, a type not accepted) is
    /// `invalid_input` naming the part.
    pub fn images(&self) -> Result<Vec<ImagePart>, Failure> {
        let SubmissionInput::Parts(parts) = self else {
            return Ok(Vec::new());
        };
        let mut images = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let invalid = |why: String| {
                Failure::new(
                    FailureKind::InvalidInput,
                    format!("input part {}: {why}", i + 1),
                )
            };
            match part {
                InputPart::Text { .. } => {}
                InputPart::ImageUrl { image_url } => {
                    images.push(image_from_url(&image_url.url).map_err(invalid)?)
                }
                InputPart::Image {
                    payload,
                    media_type,
                } => {
                    check_media_type(media_type).map_err(invalid)?;
                    images.push(ImagePart::Payload {
                        media_type: media_type.clone(),
                        payload: payload.clone(),
                    });
                }
            }
        }
        Ok(images)
    }
}

/// The image an input's URL names: inline for a `data:` URL, by URL for `http(s)`.
pub fn image_from_url(url: &str) -> Result<ImagePart, String> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest.split_once(";base64,").ok_or_else(|| {
            "a data: URL must be data:<type>;base64,<data> (other encodings are not taken)"
                .to_owned()
        })?;
        check_media_type(media_type)?;
        let data = data.trim();
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| format!("the data: URL's image is not valid base64: {e}"))?;
        return Ok(ImagePart::Base64 {
            media_type: media_type.to_owned(),
            data: data.to_owned(),
        });
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Ok(ImagePart::Url {
            url: url.to_owned(),
        });
    }
    Err(format!(
        "an image URL must be https://, http:// or data:<type>;base64,… (got {:?})",
        crate::text::cut(url, 64)
    ))
}

/// Checks `media_type` is one of [`IMAGE_MEDIA_TYPES`].
pub fn check_media_type(media_type: &str) -> Result<(), String> {
    if IMAGE_MEDIA_TYPES.contains(&media_type) {
        Ok(())
    } else {
        Err(format!(
            "image type {:?} is not taken (use one of {})",
            crate::text::cut(media_type, 64),
            IMAGE_MEDIA_TYPES.join(", ")
        ))
    }
}

/// The decoded length of base64 `data` (standard alphabet, padded or not), without decoding it.
pub fn base64_decoded_len(data: &str) -> u64 {
    let data = data.trim_end_matches('=');
    (data.len() as u64 * 3) / 4
}

/// What kind of JSON value `value` is, with its article (`"a string"`, `"null"`), for errors.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reference(size: u64) -> PayloadRef {
        PayloadRef {
            bucket: "skein-payloads-acme".into(),
            name: "s1/t1/abc".into(),
            size,
            digest: "SHA-256=x".into(),
        }
    }

    #[test]
    fn a_string_input_reads_and_writes_as_before() {
        let input: SubmissionInput = serde_json::from_value(json!("hello")).expect("decodes");
        assert_eq!(input, SubmissionInput::Text("hello".into()));
        assert_eq!(
            serde_json::to_value(&input).expect("encodes"),
            json!("hello")
        );
        assert_eq!(input.text(), "hello");
        assert_eq!(input.images(), Ok(Vec::new()));
    }

    #[test]
    fn parts_in_openais_shape_and_by_reference_are_read_in_order() {
        let wire = json!([
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
            {"type": "image", "payload": reference(7_000_000), "media_type": "image/jpeg"},
            {"type": "text", "text": "Compare them."}
        ]);
        let input: SubmissionInput = serde_json::from_value(wire.clone()).expect("decodes");
        assert_eq!(input.text(), "What is in these?\n\nCompare them.");
        assert!(!input.is_empty());
        assert_eq!(serde_json::to_value(&input).expect("encodes"), wire);
        let images = input.images().expect("valid parts");
        assert_eq!(
            images,
            vec![
                ImagePart::Url {
                    url: "https://example.com/cat.png".into()
                },
                ImagePart::Base64 {
                    media_type: "image/png".into(),
                    data: "aGVsbG8=".into()
                },
                ImagePart::Payload {
                    media_type: "image/jpeg".into(),
                    payload: reference(7_000_000)
                },
            ]
        );
        assert_eq!(images[1].size(), Some(5));
        assert_eq!(images[2].size(), Some(7_000_000));
    }

    #[test]
    fn bad_parts_are_refused_naming_the_part() {
        let unknown = serde_json::from_value::<SubmissionInput>(
            json!([{"type": "text", "text": "hi"}, {"type": "audio", "data": "x"}]),
        )
        .expect_err("an unknown part type");
        assert!(
            unknown.to_string().contains("input part 2 (\"audio\")"),
            "{unknown}"
        );
        let number = serde_json::from_value::<SubmissionInput>(json!(42)).expect_err("a number");
        assert!(
            number.to_string().contains("a string or an array"),
            "{number}"
        );
        let missing = serde_json::from_value::<SubmissionInput>(json!([{"type": "image_url"}]))
            .expect_err("no image_url");
        assert!(missing.to_string().contains("input part 1"), "{missing}");

        for (url, says) in [
            ("ftp://example.com/a.png", "must be https://"),
            ("data:image/png,rawbytes", "data:<type>;base64"),
            ("data:image/svg+xml;base64,PHN2Zz4=", "not taken"),
            ("data:image/png;base64,@@not base64@@", "not valid base64"),
        ] {
            let input = SubmissionInput::Parts(vec![
                InputPart::Text {
                    text: "look".into(),
                },
                InputPart::ImageUrl {
                    image_url: ImageUrl {
                        url: url.into(),
                        detail: None,
                    },
                },
            ]);
            let failure = input.images().expect_err(url);
            assert_eq!(failure.kind, FailureKind::InvalidInput, "{url}");
            assert!(
                failure.message.starts_with("input part 2: "),
                "{}",
                failure.message
            );
            assert!(failure.message.contains(says), "{url}: {}", failure.message);
        }
        let stored_svg = SubmissionInput::Parts(vec![InputPart::Image {
            payload: reference(10),
            media_type: "image/svg+xml".into(),
        }]);
        assert_eq!(
            stored_svg.images().map_err(|f| f.kind),
            Err(FailureKind::InvalidInput)
        );
    }

    #[test]
    fn an_input_of_images_alone_is_not_empty_and_blank_text_is() {
        let blank = SubmissionInput::Parts(vec![InputPart::Text { text: "  ".into() }]);
        assert!(blank.is_empty());
        assert!(SubmissionInput::Parts(Vec::new()).is_empty());
        let image_only = SubmissionInput::Parts(vec![InputPart::ImageUrl {
            image_url: ImageUrl {
                url: "https://example.com/a.png".into(),
                detail: None,
            },
        }]);
        assert!(!image_only.is_empty());
        assert_eq!(image_only.text(), "");
    }

    #[test]
    fn caps_refuse_too_many_images_and_an_image_too_large_naming_the_setting() {
        let limits = ImageLimits {
            max_image_bytes: 100,
            max_images: 2,
        };
        let small = ImagePart::Base64 {
            media_type: "image/png".into(),
            data: "aGVsbG8=".into(),
        };
        let url = ImagePart::Url {
            url: "https://example.com/a.png".into(),
        };
        assert!(limits
            .check("the input", &[small.clone(), url.clone()])
            .is_ok());
        let many = limits
            .check("the input", &[small.clone(), url.clone(), small.clone()])
            .expect_err("three images");
        assert_eq!(many.kind, FailureKind::TooLarge);
        assert!(
            many.message.contains("SKEIN_MODEL_MAX_IMAGES"),
            "{}",
            many.message
        );
        let large = ImagePart::Payload {
            media_type: "image/png".into(),
            payload: reference(101),
        };
        let big = limits
            .check("the tool's result", &[url, large])
            .expect_err("an image over the byte cap");
        assert_eq!(big.kind, FailureKind::TooLarge);
        assert!(
            big.message
                .contains("image 2 of the tool's result is 101 bytes")
                && big.message.contains("SKEIN_MODEL_MAX_IMAGE_BYTES"),
            "{}",
            big.message
        );
    }

    #[test]
    fn decoded_lengths_are_computed_from_the_text() {
        for raw in [&b""[..], b"a", b"ab", b"abc", b"abcd", b"hello world"] {
            let data = base64::engine::general_purpose::STANDARD.encode(raw);
            assert_eq!(base64_decoded_len(&data), raw.len() as u64, "{data}");
        }
    }
}
