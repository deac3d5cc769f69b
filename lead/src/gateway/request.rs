//! What every request of the gateway shares: errors in OpenAI's shape, the key a request
//! carries and its rate limit ([`admit`]), its body within the size limit ([`body`]), the agent
//! its `model` names ([`check_agent`]), the id an `Idempotency-Key` makes ([`request_id`]), a
//! run's submission built and checked ([`submission`]), the conversation seeded before it
//! ([`seed`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use skein_common::protocol::content::ImageUrl;
use skein_common::protocol::{
    InputPart, MultitaskPolicy, OutputSchema, SubmissionInput, TaskSubmission, PROTOCOL_VERSION,
};

use super::keys::{Principal, Role};
use super::Gateway;

/// A message's content: a string, or parts: text parts, and image parts (chat's `image_url`,
/// the Responses API's `input_image`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<Value>),
}

/// Content part types that hold an image.
const IMAGE_PARTS: [&str; 2] = ["image_url", "input_image"];

impl Content {
    /// The text of the content: the string, or its text parts joined (image parts are read by
    /// [`images`](Self::images)); a part of another type is refused.
    pub(crate) fn text(&self) -> Result<String, String> {
        match self {
            Content::Text(text) => Ok(text.clone()),
            Content::Parts(parts) => {
                let mut text = String::new();
                for part in parts {
                    match part.get("type").and_then(Value::as_str) {
                        Some("text" | "input_text" | "output_text") => {
                            text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                        }
                        Some(kind) if IMAGE_PARTS.contains(&kind) => {}
                        other => {
                            return Err(format!(
                                "content parts of type {} are not accepted; send text or images",
                                other.unwrap_or("(none)")
                            ))
                        }
                    }
                }
                Ok(text)
            }
        }
    }

    /// The image parts, as a submission's parts: `{"type": "image_url", "image_url": {"url"}}`
    /// (or a plain string URL) and `{"type": "input_image", "image_url": "…"}`. The URL is
    /// `https://…`, `http://…` or a base64 `data:` URL (checked with the submission); an image by
    /// `file_id` is refused.
    pub(crate) fn images(&self) -> Result<Vec<InputPart>, String> {
        let Content::Parts(parts) = self else {
            return Ok(Vec::new());
        };
        let mut images = Vec::new();
        for part in parts {
            let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
            if !IMAGE_PARTS.contains(&kind) {
                continue;
            }
            let url = match part.get("image_url") {
                Some(Value::String(url)) => Some(url.clone()),
                Some(Value::Object(inner)) => {
                    inner.get("url").and_then(Value::as_str).map(str::to_owned)
                }
                _ => None,
            };
            let url = url.ok_or_else(|| {
                if part.get("file_id").is_some() {
                    format!("{kind} parts by file_id are not accepted; send image_url")
                } else {
                    format!("an {kind} part needs an image_url")
                }
            })?;
            images.push(InputPart::ImageUrl {
                image_url: ImageUrl { url, detail: None },
            });
        }
        Ok(images)
    }
}

/// Longest `Idempotency-Key` taken.
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with its status.
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: String,
    message: String,
    /// Seconds a refused caller waits before it asks again (`Retry-After`, a 429's).
    retry_after: Option<u64>,
}

impl ApiError {
    /// What went wrong, for a protocol that reports it in its own shape.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The error in the shape of the Agent Protocol's server (`{"detail": message}`), with its
    /// status and `Retry-After`.
    pub(crate) fn into_detail(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            json!({ "detail": self.message, "code": self.code }).to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": {
            "message": self.message,
            "type": self.kind,
            "param": Value::Null,
            "code": self.code,
        } });
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

pub(crate) fn error(
    status: StatusCode,
    kind: &'static str,
    code: &str,
    message: impl Into<String>,
) -> ApiError {
    ApiError {
        status,
        kind,
        code: code.to_owned(),
        message: message.into(),
        retry_after: None,
    }
}

pub(crate) fn invalid(message: impl Into<String>) -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_request",
        message,
    )
}

pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        message,
    )
}

pub(crate) fn json_response(body: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The caller a request's key proves, with `role`, within its key's request limit; or the
/// 401/403/429 that says why not. A limit that cannot be counted (Redis unreachable) lets the
/// request through, with a warning: the limit protects the cluster, it does not gate it.
pub(crate) async fn admit(
    gateway: &Gateway,
    headers: &HeaderMap,
    role: Role,
) -> Result<Principal, ApiError> {
    admitted(gateway, headers, Some(role)).await
}

/// The caller a request's key proves, whatever its roles (reading what its tenant may see), within
/// its key's request limit.
pub(crate) async fn admit_any(
    gateway: &Gateway,
    headers: &HeaderMap,
) -> Result<Principal, ApiError> {
    admitted(gateway, headers, None).await
}

async fn admitted(
    gateway: &Gateway,
    headers: &HeaderMap,
    role: Option<Role>,
) -> Result<Principal, ApiError> {
    let principal = authenticate(gateway, headers, role)?;
    let limit = principal
        .requests_per_minute
        .unwrap_or(gateway.requests_per_minute);
    if limit == 0 {
        return Ok(principal);
    }
    let now = skein_common::protocol::now_ms() / 1000;
    match gateway
        .store
        .count_request(&principal.tenant, &principal.key_id, now)
        .await
    {
        Ok(count) if count > u64::from(limit) => {
            let window = skein_common::store::rate::WINDOW_SECS;
            let mut refused = error(
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
                format!(
                    "this key may make {limit} requests a minute; try again in {} s",
                    window - now % window
                ),
            );
            refused.retry_after = Some(window - now % window);
            Err(refused)
        }
        Ok(_) => Ok(principal),
        Err(e) => {
            tracing::warn!(error = %e, "requests could not be counted; the request goes through");
            Ok(principal)
        }
    }
}

/// The caller a request's key proves, with `role`; or the 401/403 that says why not.
fn authenticate(
    gateway: &Gateway,
    headers: &HeaderMap,
    role: Option<Role>,
) -> Result<Principal, ApiError> {
    // `Authorization: Bearer`, or `x-api-key` as LangGraph's and Anthropic's clients send it.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    let Some(key) = presented.filter(|k| !k.is_empty()) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing_api_key",
            "no API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
        ));
    };
    let Some(principal) = gateway.keys.verify(key) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "the API key is not known",
        ));
    };
    if let Some(role) = role.filter(|role| !principal.may(*role)) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            format!(
                "principal {} may not {role:?} in tenant {}",
                principal.name, principal.tenant
            ),
        ));
    }
    Ok(principal.clone())
}

/// The request's body, or the 413 (over the limit) or 400 that says why not.
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    match body {
        Ok(body) => Ok(body),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            "the request body is larger than the gateway takes",
        )),
        Err(rejection) => Err(invalid(rejection.body_text())),
    }
}

/// The caller (within its key's limit, with the `submit` role) and the body of a request that
/// starts runs.
pub(crate) async fn admitted_body(
    gateway: &Gateway,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Principal, Bytes), ApiError> {
    let principal = admit(gateway, headers, Role::Submit).await?;
    Ok((principal, self::body(body)?))
}

/// Refuses a `model` that names no agent of the cluster (404, listing the agents).
pub(crate) fn check_agent(gateway: &Gateway, model: &str) -> Result<(), ApiError> {
    if gateway.agents.names().any(|name| name == model) {
        return Ok(());
    }
    let known: Vec<&str> = gateway.agents.names().collect();
    Err(error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "model_not_found",
        format!(
            "the model {model:?} is no agent of this cluster; models: {}",
            known.join(", ")
        ),
    ))
}

/// The id of a request's run: from its `Idempotency-Key` within the tenant (a retry is the same
/// run), else new.
pub(crate) fn request_id(principal: &Principal, headers: &HeaderMap) -> Result<String, ApiError> {
    match headers.get("idempotency-key") {
        Some(key) => {
            let key = key
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY)
                .ok_or_else(|| invalid("Idempotency-Key must be 1 to 255 visible characters"))?;
            let hash = Sha256::digest(format!("{}\n{key}", principal.tenant).as_bytes());
            Ok(hash.iter().take(16).map(|b| format!("{b:02x}")).collect())
        }
        None => Ok(uuid::Uuid::new_v4().simple().to_string()),
    }
}

/// What a gateway run is: its task and session ids, the agent and the input.
pub(crate) struct RunSpec {
    pub task_id: String,
    pub session: String,
    pub agent: String,
    pub input: String,
    /// Images of the user's message, after `input`.
    pub images: Vec<InputPart>,
    /// The JSON Schema the answer must match, when the request asks for one.
    pub output_schema: Option<OutputSchema>,
}

/// Where an OpenAI-shaped request says how the answer is formatted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FormatShape {
    /// Chat Completions' `response_format`: the schema's fields under `json_schema`.
    Chat,
    /// The Responses API's `text.format`: the schema's fields beside `type`.
    Responses,
}

/// The output schema `format` asks for: `json_schema` its schema (with its `name`,
/// `description` and `strict`), `json_object` any object, `text` (or none) no schema. Another
/// type is refused (400).
pub(crate) fn output_schema(
    format: Option<&Value>,
    shape: FormatShape,
) -> Result<Option<OutputSchema>, ApiError> {
    let Some(format) = format.filter(|format| !format.is_null()) else {
        return Ok(None);
    };
    let field = match shape {
        FormatShape::Chat => "response_format",
        FormatShape::Responses => "text.format",
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputSchema::new(json!({ "type": "object" })))),
        Some("json_schema") => {
            let fields = match shape {
                FormatShape::Chat => format.get("json_schema").cloned().unwrap_or(Value::Null),
                FormatShape::Responses => {
                    let mut fields = format.clone();
                    if let Some(object) = fields.as_object_mut() {
                        object.remove("type");
                    }
                    fields
                }
            };
            serde_json::from_value(fields)
                .map(Some)
                .map_err(|e| invalid(format!("{field}: not a JSON schema format: {e}")))
        }
        other => Err(invalid(format!(
            "{field}: type {} is not supported (use text, json_object or json_schema)",
            other.map_or_else(|| "(none)".to_owned(), |t| format!("{t:?}"))
        ))),
    }
}

/// The submission of `principal`'s run `spec` (queued behind a running turn of its session),
/// once it passes the protocol's checks (413 for an input over the limit).
pub(crate) fn submission(
    gateway: &Gateway,
    principal: &Principal,
    spec: RunSpec,
) -> Result<TaskSubmission, ApiError> {
    let submission = TaskSubmission {
        replay_of: None,
        v: PROTOCOL_VERSION,
        task_id: spec.task_id,
        tenant: principal.tenant.clone(),
        user: principal.name.clone(),
        session: spec.session,
        agent: spec.agent,
        input: if spec.images.is_empty() {
            SubmissionInput::Text(spec.input)
        } else {
            let text = (!spec.input.is_empty()).then_some(InputPart::Text { text: spec.input });
            SubmissionInput::Parts(text.into_iter().chain(spec.images).collect())
        },
        overrides: None,
        deadline_ms: None,
        budget: None,
        multitask: MultitaskPolicy::Enqueue,
        output_schema: spec.output_schema.map(Box::new),
    };
    let checked = submission
        .validate(gateway.client.bus().max_payload())
        .and_then(|()| submission.input.images().map(drop));
    match checked {
        Ok(()) => Ok(submission),
        Err(failure) if failure.kind == skein_common::protocol::FailureKind::TooLarge => {
            Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                failure.message,
            ))
        }
        Err(failure) => Err(invalid(failure.message)),
    }
}

/// A store that could not be reached, as a 503.
pub(crate) fn unavailable(what: &str, e: impl std::fmt::Display) -> ApiError {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "unavailable",
        format!("{what}: {e}"),
    )
}

/// `input` with the caller's instructions (system and developer messages, `instructions`) at its
/// head: the agent keeps its own system prompt.
pub(crate) fn with_instructions(input: String, instructions: &[String]) -> String {
    if instructions.is_empty() {
        input
    } else {
        format!(
            "The caller's instructions:\n{}\n\n{input}",
            instructions.join("\n\n")
        )
    }
}

/// Writes the conversation before a request's input into its new session. A retry with the same
/// `Idempotency-Key` finds it written and leaves it.
pub(crate) async fn seed(
    gateway: &Gateway,
    tenant: &str,
    session: &str,
    history: &[skein_common::protocol::message::Message],
) -> Result<(), ApiError> {
    if history.is_empty() {
        return Ok(());
    }
    let state = skein_common::store::SessionState {
        history: history.to_vec(),
        ..Default::default()
    };
    match gateway.store.save(tenant, session, 0, &state).await {
        Ok(_) | Err(skein_common::store::StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(unavailable("the conversation could not be stored", e)),
    }
}
